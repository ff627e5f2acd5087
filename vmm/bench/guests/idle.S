# Idle guest for the memory benchmark: halts with interrupts enabled, forever.
.code64
.globl _start
_start:
    sti
1:  hlt
    jmp 1b
