// What the head tells every rank of its replica, once per step: the wire format of the pipeline's
// control messages (serving.md §6.3: the head decides every step shape and broadcasts it; no
// rank decides on its own).
//
// A message crosses the control communicator (stage_group.h) as two point-to-point sends from
// world rank 0 to every other rank:
//  1. the header, kHeaderFloats floats = 16 bytes:
//       uint32 magic kMagic | uint32 kind (MessageKind) | uint64 payload_bytes
//  2. the payload, ceil(payload_bytes / 4) floats, skipped when payload_bytes is 0.
// The Communicator moves fp32 elements; messages are bytes copied into a float buffer (memcpy,
// zero-padded to a whole float). Send and Recv copy bytes and never compute on them, so any
// bit pattern (NaN payloads, int32 -1) arrives unchanged. Every rank of a replica has the same
// byte order (little-endian x86-64 and aarch64 alike); integers are written in host order.
//
// Payload, in order (uN / iN: unsigned / signed N-bit; f32; `[n] x` is n values of x):
//   u64 sequence            1, 2, 3, ... per message; a rank that sees a gap fails the group
//   u32 num_released, [num_released] i64 seq_id
//                           sequences the head's scheduler released since the last message
//                           (Model::ReleaseSequence), applied before the step runs
//   kStep / kMtpStep only:
//   u32 num_seqs, then per slice:
//     i64 seq_id | i32 start_pos | u8 flags (1 all_logits, 2 want_hidden, 4 sample.enabled) |
//     f32 temperature | i32 top_k | f32 top_p | u64 seed | i64 index | i32 logprobs |
//     u32 num_tokens, [num_tokens] i32 token_ids | u32 num_blocks, [num_blocks] i32 block_table
//   kMtpStep only, per slice: u32 n, [n] f32 hidden (the main model's post-norm hidden rows)
//
// Activations (stage s to stage s + 1, same tp rank) and the last stage's result (to the head)
// travel as plain Send/Recv whose sizes both sides derive from the step (stage_group.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward_batch.h"

namespace glm::engine::pipeline {

enum class MessageKind : uint32_t {
  kStep = 1,     // run Model::Forward over `batch`
  kMtpStep = 2,  // run Model::ForwardMtp over `batch` with `mtp_hidden` (last stage only)
  kIdle = 3,     // no step: releases, and proof that the head is alive (sent while idle)
  kStop = 4,     // the head is going away: leave the loop cleanly
};
const char* MessageKindName(MessageKind kind);

inline constexpr uint32_t kMagic = 0x31504C47;  // "GLP1"
inline constexpr size_t kHeaderFloats = 4;

struct StepMessage {
  MessageKind kind = MessageKind::kIdle;
  uint64_t sequence = 0;
  std::vector<int64_t> released;
  // The slices without input_residual / input_topk (those come from the previous stage).
  ForwardBatch batch;
  std::vector<std::vector<float>> mtp_hidden;  // kMtpStep: one entry per slice
};

// The payload bytes of `message` (the header is separate: EncodeHeader).
std::string EncodePayload(const StepMessage& message);
// Parses a payload for a message of `kind`. DataLoss naming the field on a short or malformed
// payload (a corrupt or mismatched message: the group must fail).
absl::StatusOr<StepMessage> DecodePayload(MessageKind kind, std::string_view payload);

struct Header {
  MessageKind kind = MessageKind::kIdle;
  uint64_t payload_bytes = 0;
};
void EncodeHeader(const Header& header, float out[kHeaderFloats]);
absl::StatusOr<Header> DecodeHeader(const float in[kHeaderFloats]);

// Bytes <-> a float buffer of ceil(size / 4) elements (the tail zero-padded).
size_t FloatsForBytes(size_t num_bytes);
std::vector<float> BytesToFloats(std::string_view bytes);
std::string FloatsToBytes(const std::vector<float>& floats, size_t num_bytes);

}  // namespace glm::engine::pipeline
