// NIB_CHECK: aborts with file:line on a broken programmer invariant. Never used for user input,
// which gets a Status (status.h) so that a bad file or request cannot take the process down.
#pragma once

#include <cstdio>
#include <cstdlib>

#define NIB_CHECK(cond)                                                             \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
