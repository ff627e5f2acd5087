# Boot-time guest: its first instruction exits (POST port 0x80, timestamped by the VMM as the
# first exit), then it signals "ready" (hypercall 1) and powers off with status 0.
.code64
.globl _start
_start:
    out %al, $0x80
    mov $0x510, %dx
    mov $1, %eax
    out %eax, %dx
    mov $0xf4, %dx
    xor %eax, %eax
    out %al, %dx
1:  hlt
    jmp 1b
