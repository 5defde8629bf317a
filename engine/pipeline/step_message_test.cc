#include "engine/pipeline/step_message.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace glm::engine::pipeline {
namespace {

StepMessage SampleStep() {
  StepMessage m;
  m.kind = MessageKind::kStep;
  m.sequence = 42;
  m.released = {7, -1, int64_t{1} << 40};
  SequenceSlice a;
  a.seq_id = 3;
  a.token_ids = {1, 2, 3};
  a.start_pos = 0;
  a.block_table = {5, 9};
  a.all_logits = true;
  SequenceSlice b;
  b.seq_id = int64_t{1} << 35;
  b.token_ids = {77};
  b.start_pos = 129;
  b.block_table = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  b.want_hidden = true;
  b.sample.enabled = true;
  b.sample.temperature = 0.7f;
  b.sample.top_k = 20;
  b.sample.top_p = 0.9f;
  b.sample.seed = 0xdeadbeefcafef00dULL;
  b.sample.index = 12;
  a.sample.logprobs = 20;
  a.sample.temperature = 1.5f;
  m.batch.seqs = {a, b};
  return m;
}

void ExpectSameSlice(const SequenceSlice& x, const SequenceSlice& y) {
  EXPECT_EQ(x.seq_id, y.seq_id);
  EXPECT_EQ(x.token_ids, y.token_ids);
  EXPECT_EQ(x.start_pos, y.start_pos);
  EXPECT_EQ(x.block_table, y.block_table);
  EXPECT_EQ(x.all_logits, y.all_logits);
  EXPECT_EQ(x.want_hidden, y.want_hidden);
  EXPECT_EQ(x.sample.enabled, y.sample.enabled);
  EXPECT_EQ(x.sample.temperature, y.sample.temperature);
  EXPECT_EQ(x.sample.top_k, y.sample.top_k);
  EXPECT_EQ(x.sample.top_p, y.sample.top_p);
  EXPECT_EQ(x.sample.seed, y.sample.seed);
  EXPECT_EQ(x.sample.index, y.sample.index);
  EXPECT_EQ(x.sample.logprobs, y.sample.logprobs);
}

TEST(StepMessageTest, StepRoundTripsThroughTheFloatBuffer) {
  const StepMessage m = SampleStep();
  const std::string payload = EncodePayload(m);
  // What the communicator carries: floats, the tail padded.
  const std::vector<float> wire = BytesToFloats(payload);
  ASSERT_EQ(wire.size(), FloatsForBytes(payload.size()));
  auto back = DecodePayload(MessageKind::kStep, FloatsToBytes(wire, payload.size()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sequence, 42u);
  EXPECT_EQ(back->released, m.released);
  ASSERT_EQ(back->batch.seqs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) ExpectSameSlice(back->batch.seqs[i], m.batch.seqs[i]);
}

TEST(StepMessageTest, MtpStepCarriesHiddenRowsBitExact) {
  StepMessage m = SampleStep();
  m.kind = MessageKind::kMtpStep;
  const float nan_with_payload = [] {
    uint32_t bits = 0x7fc01234;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }();
  m.mtp_hidden = {{1.5f, -0.0f, nan_with_payload}, {std::numeric_limits<float>::infinity()}};
  auto back = DecodePayload(MessageKind::kMtpStep, EncodePayload(m));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->mtp_hidden.size(), 2u);
  ASSERT_EQ(back->mtp_hidden[0].size(), 3u);
  EXPECT_EQ(std::memcmp(back->mtp_hidden[0].data(), m.mtp_hidden[0].data(), 12), 0);
  EXPECT_TRUE(std::signbit(back->mtp_hidden[0][1]));
  EXPECT_EQ(back->mtp_hidden[1], m.mtp_hidden[1]);
}

TEST(StepMessageTest, IdleAndStopCarryOnlySequenceAndReleases) {
  StepMessage m;
  m.kind = MessageKind::kIdle;
  m.sequence = 9;
  m.released = {4};
  const std::string payload = EncodePayload(m);
  EXPECT_EQ(payload.size(), 8u + 4u + 8u);
  auto back = DecodePayload(MessageKind::kIdle, payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->released, std::vector<int64_t>{4});
  EXPECT_TRUE(back->batch.seqs.empty());
}

TEST(StepMessageTest, TruncatedOrTrailingPayloadsAreDataLoss) {
  const std::string payload = EncodePayload(SampleStep());
  for (size_t n : {size_t{0}, size_t{5}, size_t{8}, payload.size() / 2, payload.size() - 1}) {
    auto r = DecodePayload(MessageKind::kStep, payload.substr(0, n));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << n << " bytes";
  }
  auto r = DecodePayload(MessageKind::kStep, payload + "x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  // A step decoded as an idle message leaves bytes over: also refused.
  EXPECT_EQ(DecodePayload(MessageKind::kIdle, payload).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(StepMessageTest, HugeCountsAreRefusedWithoutAllocating) {
  StepMessage m;
  m.kind = MessageKind::kStep;
  std::string payload = EncodePayload(m);  // sequence, 0 released, 0 seqs
  const uint32_t huge = 0xffffffffu;
  std::memcpy(payload.data() + 12, &huge, 4);  // num_seqs
  EXPECT_EQ(DecodePayload(MessageKind::kStep, payload).status().code(),
            absl::StatusCode::kDataLoss);
  std::memcpy(payload.data() + 8, &huge, 4);  // num_released
  EXPECT_EQ(DecodePayload(MessageKind::kStep, payload).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(StepMessageTest, HeaderRoundTripAndRejectsForeignBytes) {
  float h[kHeaderFloats];
  EncodeHeader(Header{MessageKind::kMtpStep, 123456789}, h);
  auto back = DecodeHeader(h);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, MessageKind::kMtpStep);
  EXPECT_EQ(back->payload_bytes, 123456789u);

  float zeros[kHeaderFloats] = {};
  EXPECT_EQ(DecodeHeader(zeros).status().code(), absl::StatusCode::kDataLoss);
  EncodeHeader(Header{static_cast<MessageKind>(9), 0}, h);
  EXPECT_EQ(DecodeHeader(h).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace glm::engine::pipeline
