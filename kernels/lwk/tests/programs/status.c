/* An exit status above 127 survives the trip. */
#include <stdlib.h>

int main(void) {
    exit(200);
}
