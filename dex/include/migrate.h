/* Popcorn Linux's <migrate.h> names (popcorn-kernel-lib), provided by
 * libdex so programs written for Popcorn build unchanged. */
#ifndef DEX_POPCORN_MIGRATE_H
#define DEX_POPCORN_MIGRATE_H
#include "dex.h"
#endif
