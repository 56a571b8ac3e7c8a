// The row loop for any CPU of the architecture (x86-64: SSE2).
#include <algorithm>
#include <cstdint>

#include "rope.h"

#define POSEMB_NS baseline
#define POSEMB_VARIANT kBaseline
#define POSEMB_NAME "baseline"
#include "rows.inc"
