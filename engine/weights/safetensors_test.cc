#include "engine/weights/safetensors.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "engine/weights/dequantize.h"
#include "engine/weights/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A safetensors file from a header text and `data_bytes` bytes of data (values 0, 1, 2, ...).
std::vector<std::byte> MakeFile(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> file(8 + header.size() + data_bytes);
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>((length >> (8 * i)) & 0xFF);
  std::memcpy(file.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) file[8 + header.size() + i] = static_cast<std::byte>(i);
  return file;
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& header, size_t data_bytes) {
  const std::vector<std::byte> file = MakeFile(header, data_bytes);
  return ParseSafetensorsHeader(file, "ckpt/bad.safetensors");
}

std::string TempPath(const std::string& name) {
  return (testing_util::ScratchDir("safetensors") / name).string();
}

TEST(SafetensorsHeaderTest, ParsesValidHeader) {
  auto header = Parse(
      R"({"__metadata__": {"format": "pt"},
          "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [16, 28]},
          "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "empty": {"dtype": "I64", "shape": [0, 5], "data_offsets": [16, 16]},
          "scalar": {"dtype": "U8", "shape": [], "data_offsets": [28, 29]}})",
      29);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 4u);
  EXPECT_EQ(header->tensors[0].name, "a");  // sorted by name
  EXPECT_EQ(header->tensors[1].name, "b");
  EXPECT_EQ(header->tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(header->tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header->tensors[1].begin, 16u);
  EXPECT_EQ(header->tensors[1].end, 28u);
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->data_size, 29u);
}

TEST(SafetensorsHeaderTest, AcceptsEveryDType) {
  for (const char* dtype : {"F32", "F16", "BF16", "F8_E4M3", "I32", "I64", "U8", "BOOL"}) {
    const size_t size = DTypeSize(*ParseDType(dtype));
    auto header = Parse(std::string(R"({"t": {"dtype": ")") + dtype +
                            R"(", "shape": [3], "data_offsets": [0, )" +
                            std::to_string(3 * size) + "]}}",
                        3 * size);
    EXPECT_TRUE(header.ok()) << dtype << ": " << header.status();
  }
}

struct BadHeaderCase {
  const char* label;
  std::string header;
  size_t data_bytes;
  const char* problem;  // substring the message must contain
  absl::StatusCode code = absl::StatusCode::kDataLoss;
};

class BadHeaderTest : public ::testing::TestWithParam<BadHeaderCase> {};

TEST_P(BadHeaderTest, RejectedWithActionableMessage) {
  const BadHeaderCase& c = GetParam();
  auto header = Parse(c.header, c.data_bytes);
  ASSERT_FALSE(header.ok()) << c.label;
  EXPECT_EQ(header.status().code(), c.code) << header.status();
  EXPECT_THAT(std::string(header.status().message()),
              AllOf(HasSubstr("ckpt/bad.safetensors"), HasSubstr(c.problem)));
  if (c.code == absl::StatusCode::kDataLoss) {
    EXPECT_THAT(std::string(header.status().message()), HasSubstr("re-download/restage"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, BadHeaderTest,
    ::testing::Values(
        BadHeaderCase{"bad_json", R"({"a": {"dtype": "F32", )", 0, "not valid JSON"},
        BadHeaderCase{"not_object", R"([1, 2])", 0, "must be a JSON object"},
        BadHeaderCase{"empty_header", "", 0, "not valid JSON"},
        BadHeaderCase{"bad_dtype",
                      R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8,
                      "tensor 'w': dtype \"F64\" is not supported",
                      absl::StatusCode::kUnimplemented},
        BadHeaderCase{"e5m2_dtype",
                      R"({"w": {"dtype": "F8_E5M2", "shape": [1], "data_offsets": [0, 1]}})",
                      1, "supported: F32, F16, BF16, F8_E4M3", absl::StatusCode::kUnimplemented},
        BadHeaderCase{"dtype_not_string",
                      R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4,
                      "tensor 'w': \"dtype\" must be a string"},
        BadHeaderCase{"missing_dtype", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4,
                      "tensor 'w': entry has no \"dtype\""},
        BadHeaderCase{"missing_shape", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
                      "tensor 'w': entry has no \"shape\""},
        BadHeaderCase{"missing_offsets", R"({"w": {"dtype": "F32", "shape": [1]}})", 4,
                      "tensor 'w': entry has no \"data_offsets\""},
        BadHeaderCase{"entry_not_object", R"({"w": 5})", 0, "tensor 'w': entry must be an object"},
        BadHeaderCase{"negative_dim",
                      R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                      "non-negative"},
        BadHeaderCase{"float_dim",
                      R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                      "non-negative"},
        BadHeaderCase{"huge_dim",
                      R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
                      4, "64-bit"},
        BadHeaderCase{"overflowing_shape",
                      R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
                      4, "more elements than fit in 64 bits"},
        BadHeaderCase{"overflowing_bytes",
                      R"({"w": {"dtype": "I64", "shape": [2305843009213693952], "data_offsets": [0, 4]}})",
                      4, "needs more bytes than fit in 64 bits"},
        BadHeaderCase{"zero_dim_overflow_still_checked",
                      R"({"w": {"dtype": "U8", "shape": [9223372036854775807, 2, 0], "data_offsets": [0, 0]}})",
                      0, "more elements than fit in 64 bits"},
        BadHeaderCase{"offsets_reversed",
                      R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8,
                      "tensor 'w': data_offsets [8, 4] has begin > end"},
        BadHeaderCase{"offsets_past_end",
                      R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [4, 20]}})", 16,
                      "tensor 'w': data_offsets [4, 20] run past the end of the data section"},
        BadHeaderCase{"offsets_not_pair",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8,
                      "\"data_offsets\" must be [begin, end]"},
        BadHeaderCase{"offsets_negative",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 8,
                      "\"data_offsets\" must be [begin, end]"},
        BadHeaderCase{"size_mismatch",
                      R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 8,
                      "hold 8 bytes but BF16 shape [2, 3] needs 12 bytes (size mismatch)"},
        BadHeaderCase{"overlap",
                      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
        BadHeaderCase{"same_range",
                      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                      8, "overlap"},
        BadHeaderCase{"duplicate_name",
                      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      8, "tensor 'a': name appears twice"},
        BadHeaderCase{"metadata_not_strings",
                      R"({"__metadata__": {"format": 1}})", 0,
                      "\"__metadata__\" value for \"format\" must be a string"},
        BadHeaderCase{"metadata_not_object", R"({"__metadata__": [1]})", 0,
                      "\"__metadata__\" must be an object"},
        BadHeaderCase{"empty_name", R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                      4, "tensor name is empty"}),
    [](const ::testing::TestParamInfo<BadHeaderCase>& param_info) { return param_info.param.label; });

TEST(SafetensorsHeaderTest, RejectsHeaderLengthPastEnd) {
  std::vector<std::byte> file = MakeFile(R"({})", 0);
  file[0] = std::byte{200};  // claims a 200-byte header in a 10-byte file
  auto header = ParseSafetensorsHeader(file, "x.safetensors");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("header length 200 bytes runs past the end"),
                    HasSubstr("re-download")));
}

TEST(SafetensorsHeaderTest, RejectsInsaneHeaderLength) {
  std::vector<std::byte> file = MakeFile(R"({})", 0);
  file[7] = std::byte{0x01};  // 2^56 + 2
  auto header = ParseSafetensorsHeader(file, "x.safetensors");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("exceeds the 100000000-byte limit"));
  // Just over the limit, even when the file would be long enough, is rejected too.
  const uint64_t length = kMaxSafetensorsHeaderBytes + 1;
  std::vector<std::byte> prefix(16);
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<std::byte>((length >> (8 * i)) & 0xFF);
  EXPECT_FALSE(ParseSafetensorsHeader(prefix, "y").ok());
}

TEST(SafetensorsHeaderTest, RejectsTinyFile) {
  std::vector<std::byte> file(5);
  auto header = ParseSafetensorsHeader(file, "x.safetensors");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("too short"));
}

TEST(SafetensorsHeaderTest, AllowsPaddingAndEmptyTensorsSharingOffsets) {
  auto header = Parse(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                          "y": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]}}     )",
                      4);
  EXPECT_TRUE(header.ok()) << header.status();
}

TEST(SafetensorsHeaderTest, DeeplyNestedJsonIsRejectedWithoutRecursing) {
  const size_t depth = 300000;  // far past what a recursive printer survives
  auto header = Parse(std::string(depth, '[') + std::string(depth, ']'), 0);
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("must be a JSON object, got [[...]]"));
  auto nested = Parse("{\"__metadata__\": {\"k\": " + std::string(depth, '[') +
                          std::string(depth, ']') + "}}",
                      0);
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(std::string(nested.status().message()), HasSubstr("must be a string, got [[...]]"));
}

TEST(SafetensorsHeaderTest, LongNamesAreShortenedInMessages) {
  const std::string name(100000, 'x');
  auto header = Parse("{\"" + name + "\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
  ASSERT_FALSE(header.ok());
  EXPECT_LT(header.status().message().size(), 400u);
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("xxx..."));
}

TEST(SafetensorsFileTest, OpenMissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(TempPath("does-not-exist.safetensors"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("does-not-exist.safetensors"));
}

TEST(SafetensorsFileTest, OpenTruncatedFileNamesIt) {
  const std::string path = TempPath("truncated.safetensors");
  SafetensorsWriter writer;
  const std::vector<float> values(100, 1.5f);
  ASSERT_TRUE(writer.AddFloat("w", DType::kF32, {10, 10}, values).ok());
  std::vector<std::byte> bytes = writer.Serialize();
  bytes.resize(bytes.size() - 1);  // lose the last byte
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(file.status().message()),
              AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("past the end"),
                    HasSubstr("re-download/restage")));
}

TEST(SafetensorsWriterTest, RoundTripsEveryKind) {
  const std::string path = TempPath("roundtrip.safetensors");
  SafetensorsWriter writer;
  const std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::vector<float> bf16 = {1.0f, -2.0f, 0.5f, 3.0f};  // exactly representable
  const std::vector<float> f16 = {0.25f, -65504.0f, 0x1.0p-24f};
  const std::vector<int32_t> ints = {1, -2, 3};
  ASSERT_TRUE(writer.AddFloat("a.f32", DType::kF32, {2, 3}, f32).ok());
  ASSERT_TRUE(writer.AddFloat("a.bf16", DType::kBF16, {4}, bf16).ok());
  ASSERT_TRUE(writer.AddFloat("a.f16", DType::kF16, {3}, f16).ok());
  ASSERT_TRUE(writer.Add("a.i32", DType::kI32, {3}, std::as_bytes(std::span(ints))).ok());
  std::vector<float> matrix(130 * 3);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i % 17) - 8.0f;
  ASSERT_TRUE(writer.AddFp8BlockQuantized("m.weight", {130, 3}, matrix).ok());
  writer.SetMetadata("format", "pt");
  EXPECT_FALSE(writer.AddFloat("a.f32", DType::kF32, {2, 3}, f32).ok());  // duplicate
  EXPECT_FALSE(writer.AddFloat("bad", DType::kF32, {4}, f32).ok());       // size mismatch
  ASSERT_TRUE(writer.WriteFile(path).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->header().header_size % 8, 0u);
  EXPECT_EQ((*file)->tensors().size(), 6u);
  auto read = [&](const std::string& name) {
    auto view = (*file)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    auto values = DecodeToFloat(*view);
    EXPECT_TRUE(values.ok()) << values.status();
    return *values;
  };
  EXPECT_EQ(read("a.f32"), f32);
  EXPECT_EQ(read("a.bf16"), bf16);
  EXPECT_EQ(read("a.f16"), f16);
  auto int_view = (*file)->Get("a.i32");
  ASSERT_TRUE(int_view.ok());
  EXPECT_EQ(int_view->shape, std::vector<int64_t>{3});
  EXPECT_EQ(std::memcmp(int_view->data, ints.data(), 12), 0);
  EXPECT_EQ(DecodeToFloat(*int_view).status().code(), absl::StatusCode::kUnimplemented);

  auto weight = (*file)->Get("m.weight");
  auto scale = (*file)->Get("m.weight_scale_inv");
  ASSERT_TRUE(weight.ok() && scale.ok());
  EXPECT_EQ(weight->dtype, DType::kF8E4M3);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{2, 1}));
  auto dequantized = DecodeToFloat(*weight, &*scale);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  // Integers -8..8 with scale 8/448 quantize to 448·k/8 = 56k, exact in e4m3 only for some k;
  // the error bound for e4m3 normals is 2^-4 relative.
  for (size_t i = 0; i < matrix.size(); ++i) {
    EXPECT_NEAR((*dequantized)[i], matrix[i], std::fabs(matrix[i]) / 16 + 1e-6) << i;
  }
  EXPECT_FALSE((*file)->Get("nope").ok());
}

}  // namespace
}  // namespace glm::engine

namespace glm::engine {
namespace {

// The fuzz seed corpus stays meaningful: valid_* files parse, the others are rejected.
TEST(SafetensorsCorpusTest, SeedsParseAsNamed) {
  const char* source_dir = std::getenv("GLM_SOURCE_DIR");
  if (source_dir == nullptr) GTEST_SKIP() << "GLM_SOURCE_DIR not set (run through ctest)";
  const fs::path corpus = fs::path(source_dir) / "tests/fuzz/corpus/safetensors/header";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    auto file = SafetensorsFile::Open(entry.path().string());
    const bool expect_ok = entry.path().filename().string().rfind("valid_", 0) == 0;
    EXPECT_EQ(file.ok(), expect_ok) << entry.path() << ": " << file.status();
    ++count;
  }
  EXPECT_GE(count, 5);
}

}  // namespace
}  // namespace glm::engine
