# Exit round-trip guest: 20000 one-byte writes to port 0x90, then power off with status 0.
.code64
.globl _start
_start:
    mov $20000, %ecx
1:  out %al, $0x90
    dec %ecx
    jnz 1b
    mov $0xf4, %dx
    xor %eax, %eax
    out %al, %dx
2:  hlt
    jmp 2b
