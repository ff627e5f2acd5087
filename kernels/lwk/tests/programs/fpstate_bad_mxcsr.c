/* A handler that sets reserved MXCSR bits in its frame's fpstate: sigreturn refuses the frame
   and the job ends with SIGSEGV (139), as on Linux, where the FXRSTOR/XRSTOR would fault;
   the kernel itself must not. */
#define _GNU_SOURCE
#include <string.h>

#include "spoiled_frame.h"

static void spoil_mxcsr(uint8_t *fpstate) {
    uint32_t mxcsr = 0xffffffffu;
    memcpy(fpstate + 24, &mxcsr, 4);
}

int main(void) { return raise_with_spoiled_frame(spoil_mxcsr, "MXCSR"); }
