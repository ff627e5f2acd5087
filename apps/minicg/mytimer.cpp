#include "mytimer.hpp"

#include <sys/time.h>
#ifndef WALL_TIMER
#include <sys/resource.h>
#endif

double mytimer() {
#ifdef WALL_TIMER
  struct timeval tp;
  gettimeofday(&tp, 0);
  return tp.tv_sec + tp.tv_usec / 1000000.0;
#else
  struct rusage ruse;
  getrusage(RUSAGE_SELF, &ruse);
  return ruse.ru_utime.tv_sec + ruse.ru_utime.tv_usec / 1000000.0 + ruse.ru_stime.tv_sec +
         ruse.ru_stime.tv_usec / 1000000.0;
#endif
}

const char *mytimer_name() {
#ifdef WALL_TIMER
  return "gettimeofday";
#else
  return "getrusage";
#endif
}
