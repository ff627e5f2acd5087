// Seconds from some fixed point. As in the Mantevo mini-apps, the default is the process's CPU
// time from getrusage (user + system); built with -DWALL_TIMER it is gettimeofday's wall clock.
#ifndef MINICG_MYTIMER_HPP
#define MINICG_MYTIMER_HPP

double mytimer();
const char *mytimer_name();

#endif
