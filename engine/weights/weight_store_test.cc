#include "engine/weights/weight_store.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "engine/weights/float_codec.h"
#include "engine/weights/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const fs::path dir = testing_util::ScratchDir("weight_store") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<float> Iota(size_t count, float start = 0.0f, float step = 1.0f) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = start + step * static_cast<float>(i);
  return values;
}

// A two-layer model plus an MTP layer (index 2), split across shards:
//   shard 1: embed_tokens, layer 0;  shard 2: layer 1;  shard 3: layer 2 (MTP), norm, lm_head.
struct ShardedCheckpoint {
  std::string dir;
  std::map<std::string, std::string> weight_map;
  uint64_t tensor_bytes = 0;

  explicit ShardedCheckpoint(const std::string& name) : dir(FreshDir(name)) {
    SafetensorsWriter shard1, shard2, shard3;
    Add(shard1, "model-00001-of-00003.safetensors", "model.embed_tokens.weight", DType::kBF16, {8, 4});
    Add(shard1, "model-00001-of-00003.safetensors", "model.layers.0.input_layernorm.weight", DType::kF32, {4});
    AddFp8(shard1, "model-00001-of-00003.safetensors", "model.layers.0.mlp.down_proj.weight", {4, 6});
    Add(shard2, "model-00002-of-00003.safetensors", "model.layers.1.input_layernorm.weight", DType::kF32, {4});
    AddFp8(shard2, "model-00002-of-00003.safetensors", "model.layers.1.mlp.down_proj.weight", {4, 6});
    Add(shard3, "model-00003-of-00003.safetensors", "model.layers.2.eh_proj.weight", DType::kBF16, {4, 8});
    Add(shard3, "model-00003-of-00003.safetensors", "model.norm.weight", DType::kF32, {4});
    Add(shard3, "model-00003-of-00003.safetensors", "lm_head.weight", DType::kBF16, {8, 4});
    EXPECT_TRUE(shard1.WriteFile(dir + "/model-00001-of-00003.safetensors").ok());
    EXPECT_TRUE(shard2.WriteFile(dir + "/model-00002-of-00003.safetensors").ok());
    EXPECT_TRUE(shard3.WriteFile(dir + "/model-00003-of-00003.safetensors").ok());
  }

  void Add(SafetensorsWriter& writer, const std::string& shard, const std::string& name,
           DType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    EXPECT_TRUE(writer.AddFloat(name, dtype, shape, Iota(static_cast<size_t>(count), 1.0f)).ok());
    weight_map[name] = shard;
    tensor_bytes += static_cast<uint64_t>(count) * DTypeSize(dtype);
  }

  void AddFp8(SafetensorsWriter& writer, const std::string& shard, const std::string& name,
              std::vector<int64_t> shape) {
    const auto count = static_cast<size_t>(shape[0] * shape[1]);
    EXPECT_TRUE(writer.AddFp8BlockQuantized(name, shape, Iota(count, -3.0f, 0.25f), {2, 4}).ok());
    weight_map[name] = shard;
    weight_map[name + "_scale_inv"] = shard;
    tensor_bytes += count + 4 * 2 * 2;  // scale [2, 2] F32
  }

  void WriteIndex(std::optional<uint64_t> total_size) const {
    EXPECT_TRUE(WriteSafetensorsIndex(dir + "/model.safetensors.index.json", weight_map,
                                      total_size).ok());
  }
};

WeightStoreOptions Fp8Options() {
  WeightStoreOptions options;
  options.block = {2, 4};
  return options;
}

TEST(WeightStoreTest, OpensSingleFileDirectory) {
  const std::string dir = FreshDir("single");
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddFloat("model.norm.weight", DType::kBF16, {4}, Iota(4)).ok());
  ASSERT_TRUE(writer.AddFloat("lm_head.weight", DType::kF32, {3, 4}, Iota(12)).ok());
  ASSERT_TRUE(writer.WriteFile(dir + "/model.safetensors").ok());

  for (const std::string& path : {dir, dir + "/model.safetensors"}) {
    auto store = WeightStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_THAT((*store)->TensorNames(), ElementsAre("lm_head.weight", "model.norm.weight"));
    EXPECT_EQ((*store)->total_tensor_bytes(), 8u + 48u);
    auto view = (*store)->Get("lm_head.weight");
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->dtype, DType::kF32);
    EXPECT_EQ(view->shape, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(view->nbytes, 48u);
    EXPECT_EQ((*store)->ReadFloat("model.norm.weight").value(), Iota(4));
    EXPECT_EQ((*store)->ReadFloat("lm_head.weight", {3, 4}).value(), Iota(12));
  }
}

TEST(WeightStoreTest, EmptyDirectoryIsNotFound) {
  auto store = WeightStore::Open(FreshDir("empty"));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("neither model.safetensors.index.json nor model.safetensors"));
  EXPECT_EQ(WeightStore::Open(FreshDir("empty") + "/nope").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(WeightStoreTest, OpensShardedCheckpoint) {
  ShardedCheckpoint ckpt("sharded");
  ckpt.WriteIndex(ckpt.tensor_bytes);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->num_tensors(), ckpt.weight_map.size());
  EXPECT_EQ((*store)->files().size(), 3u);
  EXPECT_THAT((*store)->FileOf("lm_head.weight"), HasSubstr("model-00003-of-00003.safetensors"));
  EXPECT_EQ((*store)->ReadFloat("lm_head.weight", {8, 4}).value(), Iota(32, 1.0f));
  EXPECT_TRUE((*store)->ScaleFor("model.layers.1.mlp.down_proj.weight").has_value());
  EXPECT_FALSE((*store)->ScaleFor("model.norm.weight").has_value());

  // Dequantized fp8 is close to the original values (e4m3: 2^-4 relative, plus subnormals).
  auto down = (*store)->ReadFloat("model.layers.1.mlp.down_proj.weight", {4, 6});
  ASSERT_TRUE(down.ok()) << down.status();
  const std::vector<float> original = Iota(24, -3.0f, 0.25f);
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_NEAR((*down)[i], original[i], std::fabs(original[i]) / 16 + 1e-3) << i;
  }

  auto bad_shape = (*store)->ReadFloat("lm_head.weight", {4, 8});
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_THAT(std::string(bad_shape.status().message()),
              AllOf(HasSubstr("model-00003-of-00003.safetensors"), HasSubstr("lm_head.weight"),
                    HasSubstr("has shape [8, 4] but the model config expects [4, 8]")));
  auto missing = (*store)->Get("model.layers.9.mlp.gate.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(HasSubstr(ckpt.dir), HasSubstr("model.layers.9.mlp.gate.weight")));
}

TEST(WeightStoreTest, LocationOfPointsAtTheTensorBytesInItsFile) {
  ShardedCheckpoint ckpt("location");
  ckpt.WriteIndex(ckpt.tensor_bytes);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_TRUE(store.ok()) << store.status();
  for (const std::string name : {"lm_head.weight", "model.layers.1.mlp.down_proj.weight",
                                 "model.layers.1.mlp.down_proj.weight_scale_inv"}) {
    std::optional<WeightStore::TensorLocation> where = (*store)->LocationOf(name);
    ASSERT_TRUE(where.has_value()) << name;
    EXPECT_EQ(where->path, (*store)->FileOf(name)) << name;
    auto view = (*store)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(where->length, view->nbytes) << name;
    // The bytes at [offset, offset + length) of the file are the tensor's.
    std::ifstream in(where->path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(where->offset));
    std::string bytes(where->length, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_EQ(0, std::memcmp(bytes.data(), view->data, view->nbytes)) << name;
    // Dropping the store's mapping keeps the tensor readable (it faults back in).
    (*store)->ReleaseMappedPages(name);
  }
  EXPECT_EQ((*store)->ReadFloat("lm_head.weight", {8, 4}).value(), Iota(32, 1.0f));
  EXPECT_FALSE((*store)->LocationOf("model.layers.9.mlp.gate.weight").has_value());
  // The header ends where the data section starts; every tensor lies after it.
  const std::string shard3 = (*store)->FileOf("lm_head.weight");
  std::optional<uint64_t> data = (*store)->DataOffsetOf(shard3);
  ASSERT_TRUE(data.has_value());
  EXPECT_LE(*data, (*store)->LocationOf("lm_head.weight")->offset);
  EXPECT_FALSE((*store)->DataOffsetOf(ckpt.dir + "/nope.safetensors").has_value());
  (*store)->ReleaseMappedRange(shard3, 0, *data);
  EXPECT_EQ((*store)->ReadFloat("lm_head.weight", {8, 4}).value(), Iota(32, 1.0f));
  (*store)->ReleaseMappedPages("model.layers.9.mlp.gate.weight");  // absent: no-op
}

TEST(WeightStoreTest, AcceptsTotalSizeAsFileBytes) {
  ShardedCheckpoint ckpt("total_file_bytes");
  uint64_t file_bytes = 0;
  for (const auto& entry : fs::directory_iterator(ckpt.dir)) file_bytes += entry.file_size();
  ckpt.WriteIndex(file_bytes);
  EXPECT_TRUE(WeightStore::Open(ckpt.dir, Fp8Options()).ok());
}

TEST(WeightStoreTest, RejectsWrongTotalSize) {
  ShardedCheckpoint ckpt("total_size");
  ckpt.WriteIndex(ckpt.tensor_bytes + 1);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("metadata.total_size"),
                    HasSubstr("restage")));
  WeightStoreOptions lenient = Fp8Options();
  lenient.verify_total_size = false;
  EXPECT_TRUE(WeightStore::Open(ckpt.dir, lenient).ok());
}

TEST(WeightStoreTest, MissingShardIsNamed) {
  ShardedCheckpoint ckpt("missing_shard");
  ckpt.WriteIndex(std::nullopt);
  fs::remove(ckpt.dir + "/model-00002-of-00003.safetensors");
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr("model-00002-of-00003.safetensors"), HasSubstr("does not exist"),
                    HasSubstr("model.layers.1."), HasSubstr("restage")));
}

TEST(WeightStoreTest, TensorMissingFromItsShardIsNamed) {
  ShardedCheckpoint ckpt("missing_tensor");
  ckpt.weight_map["model.layers.1.post_attention_layernorm.weight"] =
      "model-00002-of-00003.safetensors";
  ckpt.WriteIndex(std::nullopt);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr("model.layers.1.post_attention_layernorm.weight"),
                    HasSubstr("model-00002-of-00003.safetensors"),
                    HasSubstr("does not contain it")));
}

TEST(WeightStoreTest, CorruptIndexIsRejected) {
  ShardedCheckpoint ckpt("bad_index");
  std::ofstream(ckpt.dir + "/model.safetensors.index.json") << R"({"weight_map": {"a": "../../etc/passwd"}})";
  auto store = WeightStore::Open(ckpt.dir);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a relative path inside"));
  std::ofstream(ckpt.dir + "/model.safetensors.index.json") << R"({"weight_map": )";
  EXPECT_EQ(WeightStore::Open(ckpt.dir).status().code(), absl::StatusCode::kDataLoss);
}

TEST(WeightStoreTest, CorruptShardNamesFileAndTensor) {
  ShardedCheckpoint ckpt("corrupt_shard");
  ckpt.WriteIndex(std::nullopt);
  const std::string shard = ckpt.dir + "/model-00003-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 3);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr("model-00003-of-00003.safetensors"), HasSubstr("past the end"),
                    HasSubstr("re-download/restage")));
}

TEST(WeightStoreTest, EmptyWeightMapIsRejected) {
  ShardedCheckpoint ckpt("empty_index");
  std::ofstream(ckpt.dir + "/model.safetensors.index.json") << R"({"weight_map": {}})";
  auto store = WeightStore::Open(ckpt.dir);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("\"weight_map\" is empty"));
}

TEST(WeightStoreTest, ScaleMissingFromIndexIsFoundInTheShard) {
  ShardedCheckpoint ckpt("scale_not_indexed");
  ckpt.weight_map.erase("model.layers.1.mlp.down_proj.weight_scale_inv");
  ckpt.WriteIndex(std::nullopt);
  auto store = WeightStore::Open(ckpt.dir, Fp8Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->Contains("model.layers.1.mlp.down_proj.weight_scale_inv"));
  EXPECT_TRUE((*store)->ScaleFor("model.layers.1.mlp.down_proj.weight").has_value());
  auto down = (*store)->ReadFloat("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_NEAR((*down)[0], -3.0f, 0.2f);  // scaled, not the raw code value
}

TEST(WeightStoreTest, PerTensorFp8ScaleIsRejected) {
  const std::string dir = FreshDir("per_tensor_scale");
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddFloat("q.weight", DType::kF8E4M3, {2, 2}, std::vector<float>(4, 1.0f)).ok());
  ASSERT_TRUE(writer.AddFloat("q.weight_scale", DType::kF32, {}, std::vector<float>{0.5f}).ok());
  ASSERT_TRUE(writer.AddFloat("r.weight", DType::kF8E4M3, {2, 2}, std::vector<float>(4, 2.0f)).ok());
  ASSERT_TRUE(writer.WriteFile(dir + "/model.safetensors").ok());
  auto store = WeightStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto values = (*store)->ReadFloat("q.weight");
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(values.status().message()), HasSubstr("per-tensor scale"));
  // Plain FP8 without any scale decodes the codes.
  EXPECT_EQ((*store)->ReadFloat("r.weight").value(), std::vector<float>(4, 2.0f));
}

TEST(WeightStoreTest, FilterOpensOnlyNeededShards) {
  ShardedCheckpoint ckpt("filtered");
  ckpt.WriteIndex(ckpt.tensor_bytes + 12345);  // not checked with a filter
  // A first pipeline stage (layer 0 + embedding) needs shard 1 only; the others may be absent.
  fs::remove(ckpt.dir + "/model-00002-of-00003.safetensors");
  fs::remove(ckpt.dir + "/model-00003-of-00003.safetensors");
  WeightStoreOptions options = Fp8Options();
  options.filter = LayerRangeFilter(0, 0, /*embedding=*/true, /*head=*/false);
  auto store = WeightStore::Open(ckpt.dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->files().size(), 1u);
  EXPECT_THAT((*store)->TensorNames(),
              ElementsAre("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                          "model.layers.0.mlp.down_proj.weight",
                          "model.layers.0.mlp.down_proj.weight_scale_inv"));
  EXPECT_TRUE((*store)->ReadFloat("model.layers.0.mlp.down_proj.weight").ok());
  auto excluded = (*store)->Get("model.layers.1.input_layernorm.weight");
  ASSERT_FALSE(excluded.ok());
  EXPECT_THAT(std::string(excluded.status().message()), HasSubstr("excluded by the layer filter"));
}

TEST(WeightStoreTest, ScaleFollowsItsWeightThroughAFilter) {
  ShardedCheckpoint ckpt("scale_follows");
  ckpt.WriteIndex(std::nullopt);
  WeightStoreOptions options = Fp8Options();
  options.filter = [](std::string_view name) {
    return name == "model.layers.1.mlp.down_proj.weight";
  };
  auto store = WeightStore::Open(ckpt.dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->num_tensors(), 2u);
  EXPECT_TRUE((*store)->ScaleFor("model.layers.1.mlp.down_proj.weight").has_value());
}

TEST(WeightStoreTest, LastStageWithMtpLayer) {
  ShardedCheckpoint ckpt("last_stage");
  ckpt.WriteIndex(std::nullopt);
  fs::remove(ckpt.dir + "/model-00001-of-00003.safetensors");
  LayerSelection selection;
  selection.first_layer = 1;
  selection.last_layer = 1;
  selection.head = true;
  selection.num_hidden_layers = 2;
  selection.mtp = true;
  WeightStoreOptions options = Fp8Options();
  options.filter = LayerRangeFilter(selection);
  auto store = WeightStore::Open(ckpt.dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Contains("model.layers.2.eh_proj.weight"));
  EXPECT_TRUE((*store)->Contains("lm_head.weight"));
  EXPECT_TRUE((*store)->Contains("model.layers.1.mlp.down_proj.weight_scale_inv"));
  EXPECT_FALSE((*store)->Contains("model.embed_tokens.weight"));
}

TEST(WeightStoreTest, RowAndColumnSlices) {
  const std::string dir = FreshDir("slices");
  SafetensorsWriter writer;
  const std::vector<float> matrix = Iota(6 * 5);  // [6, 5], exact in bf16
  ASSERT_TRUE(writer.AddFloat("w.weight", DType::kBF16, {6, 5}, matrix).ok());
  ASSERT_TRUE(writer.AddFloat("b.bias", DType::kF32, {6}, Iota(6)).ok());
  ASSERT_TRUE(writer.AddFloat("e.weight", DType::kF32, {2, 3, 2}, Iota(12)).ok());
  std::vector<float> big(300 * 260);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  ASSERT_TRUE(writer.AddFp8BlockQuantized("q.weight", {300, 260}, big).ok());
  const std::vector<int64_t> ids = {1, 2};
  ASSERT_TRUE(writer.Add("ids", DType::kI64, {2}, std::as_bytes(std::span(ids))).ok());
  ASSERT_TRUE(writer.WriteFile(dir + "/model.safetensors").ok());
  auto store = WeightStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();

  // Rows 2..4 of [6, 5]: elements 10..19.
  EXPECT_EQ((*store)->ReadRowSlice("w.weight", 2, 4).value(), Iota(10, 10.0f));
  // Columns 1..3: each row r gives 5r+1, 5r+2.
  std::vector<float> cols;
  for (int r = 0; r < 6; ++r) {
    cols.push_back(5.0f * r + 1);
    cols.push_back(5.0f * r + 2);
  }
  EXPECT_EQ((*store)->ReadColSlice("w.weight", 1, 3).value(), cols);
  EXPECT_EQ((*store)->ReadRowSlice("b.bias", 3, 6).value(), Iota(3, 3.0f));
  EXPECT_EQ((*store)->ReadRowSlice("e.weight", 1, 2).value(), Iota(6, 6.0f));
  EXPECT_EQ((*store)->ReadColSlice("e.weight", 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->ReadRowSlice("w.weight", 4, 7).status().code(),
            absl::StatusCode::kInvalidArgument);

  // FP8 slices that cut through 128x128 blocks equal the same part of the full read.
  auto full = (*store)->ReadFloat("q.weight", {300, 260});
  ASSERT_TRUE(full.ok()) << full.status();
  auto rows = (*store)->ReadRowSlice("q.weight", 100, 200);
  auto columns = (*store)->ReadColSlice("q.weight", 130, 260);  // tp_rank 1 of tp_size 2
  ASSERT_TRUE(rows.ok() && columns.ok());
  for (int64_t i = 0; i < 100; ++i) {
    for (int64_t j = 0; j < 260; ++j) ASSERT_EQ((*rows)[i * 260 + j], (*full)[(i + 100) * 260 + j]);
  }
  for (int64_t i = 0; i < 300; ++i) {
    for (int64_t j = 0; j < 130; ++j) ASSERT_EQ((*columns)[i * 130 + j], (*full)[i * 260 + 130 + j]);
  }
  EXPECT_EQ((*store)->ReadFloat("ids").status().code(), absl::StatusCode::kUnimplemented);
}

TEST(WeightStoreTest, WrongBlockSizeIsReported) {
  const std::string dir = FreshDir("block_size");
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddFp8BlockQuantized("q.weight", {300, 260}, std::vector<float>(300 * 260, 1.0f)).ok());
  ASSERT_TRUE(writer.WriteFile(dir + "/model.safetensors").ok());
  WeightStoreOptions options;
  options.block = {64, 64};
  auto store = WeightStore::Open(dir, options);
  ASSERT_TRUE(store.ok());
  auto values = (*store)->ReadFloat("q.weight");
  ASSERT_FALSE(values.ok());
  EXPECT_THAT(std::string(values.status().message()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("weight_block_size"),
                    HasSubstr("needs [5, 5]")));
}

}  // namespace
}  // namespace glm::engine
