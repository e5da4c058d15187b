// Stand-in for cooperative_groups.h used only by TestDevtestSyntax (see cuda_runtime.h beside it).
#pragma once
namespace cooperative_groups {
struct thread_block { void sync(); unsigned thread_rank(); };
struct grid_group { void sync(); };
struct cluster_group { void sync(); unsigned block_rank(); template <class T> T* map_shared_rank(T*, unsigned); };
thread_block this_thread_block(); grid_group this_grid(); cluster_group this_cluster();
}
