/* A handler that writes a reserved byte of the XSAVE header in its frame's fpstate: sigreturn
   refuses the frame and the job ends with SIGSEGV (139), as on Linux, where the XRSTOR would
   fault; the kernel itself must not. */
#define _GNU_SOURCE
#include <string.h>

#include "spoiled_frame.h"

static void spoil_header(uint8_t *fpstate) {
    uint32_t magic1;
    memcpy(&magic1, fpstate + 464, 4);
    if (magic1 == 0x46505853u) fpstate[512 + 20] = 1; /* inside the header's reserved bytes */
}

int main(void) { return raise_with_spoiled_frame(spoil_header, "the XSAVE header"); }
