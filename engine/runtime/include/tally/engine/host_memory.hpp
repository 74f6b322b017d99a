// This host's memory and ranks: a run that cannot fit is refused in one line before it allocates
// (Note [weights beyond the host] in gpt_model.cpp), not ended by libtorch's allocator or the
// kernel's OOM killer.
#pragma once

#include <string>

namespace tally::engine {

// Physical memory in bytes (sysconf); +inf where the system does not say.
double host_memory_bytes();
// The ranks on this host: LOCAL_WORLD_SIZE (torchrun's contract; `tally launch` sets it), else 1.
int ranks_on_host();
// Throws InvalidInput "<what> <bytes> per rank, <bytes> on this host's N rank(s), more than its
// memory (<bytes>)" when bytes_per_rank × ranks_on_host() exceeds host_memory_bytes(); `what`
// names the flags and ends in a verb: "--sizes-mib 16384: its two buffers take".
void require_fits_host(double bytes_per_rank, const std::string& what);

}  // namespace tally::engine
