/* An undefined instruction (ud2): SIGILL, status 132. */
int main(void) {
    __builtin_trap();
}
