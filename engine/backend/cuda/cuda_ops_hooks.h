// A/B and test hooks of cuda_ops_attention.cu / cuda_ops_indexer.cu for the CUDA op tests and
// benches (not part of cuda_ops.h: production code does not call them). The definitions document
// each mode in full.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"  // cuda_ops.h uses it without including it
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

// Attention path: 0 by shape (default), 1 legacy, 2 staged wherever it applies, 3 tensor core
// wherever it applies, 4 / 5 / 6 tensor core with 16 / 32 / 64 heads per CTA, -1 the
// environment's (GLM_CUDA_ATTENTION_LEGACY).
void SetAttentionPathForBench(int mode);
// The path the last Attention call launched: 1 legacy, 2 staged, 3 tensor core (0: none yet).
int LastAttentionPathForBench();

// Indexer top-k select path: 0 by shape (default), 1 legacy single-CTA passes, 2 multi-CTA
// passes, 3 short-row select wherever the row fits, 4 the choice by shape before the short-row
// select, -1 the environment's (GLM_CUDA_INDEXER_LEGACY).
void SetIndexerPathForBench(int mode);
// The multi-CTA passes' ordered output: 0 over the whole GPU (IndexerOutputKernel, default), 1
// the single-CTA output pass of IndexerSelectKernel (the previous one).
void SetIndexerOutputForBench(int mode);
// Threads of the short-row select CTA (a multiple of 32 in [256, 1024]); 0 = the default.
void SetIndexerShortThreadsForBench(int threads);
// Score-kernel CTAs per SM the key chunks aim at (1..16; else back to by shape: 2, or the wide
// variant's resident CTAs per SM where that takes the call).
void SetIndexerScoreCtasPerSmForBench(int ctas);
// kMinBlocks * 100 + kKGroup * 10 + kAhead of the last tensor-core score launch (0: none yet).
int LastIndexerScoreKernelForTest();
// The tensor-core score kernel's look-ahead: 0 none, 1 the next step's key lookup, 2 (default) the
// next step's key words too; other values: back to the default.
void SetIndexerScoreAheadForBench(int ahead);
// Indexer score kernel: 0 by shape, 1 fp32 CUDA-core kernel, 2 tensor-core kernel wherever it
// applies, 3 / 4 as 2 with the other kernel variants, -1 the environment's.
void SetIndexerScorePathForBench(int mode);
// The top-k selection alone on given device scores [rows, ld] (the current path mode); same
// output contract as IndexerTopK for those scores.
absl::Status IndexerSelectForTest(const float* scores, int64_t ld, int64_t rows,
                                  const int32_t* row_num_keys, int32_t max_num_keys, int top_k,
                                  int32_t* out, Scratch& scratch, cudaStream_t stream);

}  // namespace glm::engine::cuda
