#include "launcher/elastic_batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/store.h"
#include "launcher/config/config_test_util.h"
#include "launcher/elastic_keys.h"

namespace braid::launcher {
namespace {

using ::testing::HasSubstr;

// The training program's validation for a world size (no features: DDP-style data parallel).
absl::Status Validate(config::TrainConfig* cfg, int world) { return config::test_util::Validate(cfg, world, {}); }

config::TrainConfig Batch(const std::string& text) { return config::test_util::Text(text); }

TEST(PrepareElasticBatchTest, RecomputesAccumulationPerWorldSize) {
  // The config's accumulation (3) suits 2 ranks only; an elastic job derives it per round.
  for (auto [world, accum] : {std::pair{2, 3}, std::pair{3, 2}}) {
    config::TrainConfig cfg = Batch("train_batch_size: 12 train_micro_batch_size_per_gpu: 2 gradient_accumulation_steps: 3");
    absl::StatusOr<std::string> table = PrepareElasticBatch(&cfg, {2, 3}, 1, world, Validate);
    ASSERT_TRUE(table.ok()) << table.status();
    EXPECT_FALSE(cfg.has_gradient_accumulation_steps());  // derived by the validation to come
    ASSERT_TRUE(Validate(&cfg, world).ok());
    EXPECT_EQ(cfg.gradient_accumulation_steps(), accum) << "world size " << world;
    EXPECT_EQ(cfg.train_batch_size(), 12);
    EXPECT_EQ(cfg.train_micro_batch_size_per_gpu(), 2);
    EXPECT_EQ(*table,
              "braid: elastic: train_batch_size 12 = micro-batch 2 x gradient accumulation x data-parallel "
              "size, for the world sizes of --nnodes=2:3 x 1:\n"
              "  world size 2 (2 node(s)): data-parallel 2, gradient accumulation 3\n"
              "  world size 3 (3 node(s)): data-parallel 3, gradient accumulation 2");
  }
}

TEST(PrepareElasticBatchTest, RefusesAWorldSizeThatDoesNotDivide) {
  config::TrainConfig cfg = Batch("train_batch_size: 12 train_micro_batch_size_per_gpu: 2");
  // Two processes per node: world sizes 2, 4, 6; 4 ranks × micro 2 does not divide 12.
  absl::StatusOr<std::string> r = PrepareElasticBatch(&cfg, {1, 3}, 2, 4, Validate);
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("this round's world size 4 cannot keep train_batch_size 12 ("));
  EXPECT_THAT(msg, HasSubstr("); an elastic job (--nnodes=1:3) with this config accepts world sizes 2, 6"));
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  // The table names the refused size too.
  config::TrainConfig ok = Batch("train_batch_size: 12 train_micro_batch_size_per_gpu: 2");
  absl::StatusOr<std::string> table = PrepareElasticBatch(&ok, {1, 3}, 2, 6, Validate);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(*table, HasSubstr("  world size 4 (2 node(s)): refused: "));
  ASSERT_TRUE(Validate(&ok, 6).ok());
  EXPECT_EQ(ok.gradient_accumulation_steps(), 1);
}

TEST(PrepareElasticBatchTest, TheGlobalBatchMustBeFixed) {
  config::TrainConfig cfg = Batch("train_micro_batch_size_per_gpu: 4");
  absl::StatusOr<std::string> r = PrepareElasticBatch(&cfg, {1, 3}, 2, 2, Validate);
  ASSERT_FALSE(r.ok());
  // lcm(2, 4, 6) = 12 ranks' worth of micro-batches of 4.
  EXPECT_THAT(r.status().message(),
              HasSubstr("an elastic job (--nnodes=1:3) keeps the global batch fixed while the world size "
                        "changes: set train_batch_size and train_micro_batch_size_per_gpu in the config"));
  EXPECT_THAT(r.status().message(), HasSubstr("e.g. train_batch_size: 48 with train_micro_batch_size_per_gpu: 4, "
                                              "which suits every world size from 2 to 6"));
}

TEST(ElasticCheckpointsTest, EveryRankGetsRankZerosDecision) {
  InMemoryStore store;
  ElasticCheckpoints r0(&store, 0, /*round=*/1, absl::Seconds(30)), r1(&store, 1, 1, absl::Seconds(30));
  auto go = r0.AfterCheckpoint(4);
  ASSERT_TRUE(go.ok()) << go.status();
  EXPECT_FALSE(go->has_value());
  // The launchers ask after rank 0 decided step 4: rank 1 still reads "go" for step 4.
  ASSERT_TRUE(store.Set(RegroupKey(1), "node 2 (host n2)").ok());
  auto go1 = r1.AfterCheckpoint(4);
  ASSERT_TRUE(go1.ok());
  EXPECT_FALSE(go1->has_value());
  EXPECT_EQ(*store.Get(CheckpointStepKey(), absl::Seconds(1)), "4");
  auto stop = r0.AfterCheckpoint(8);
  ASSERT_TRUE(stop.ok() && stop->has_value());
  EXPECT_EQ(**stop, "node 2 (host n2)");
  auto stop1 = r1.AfterCheckpoint(8);
  ASSERT_TRUE(stop1.ok() && stop1->has_value());
  // Another round's key is not this round's.
  ElasticCheckpoints next(&store, 0, 2, absl::Seconds(30));
  EXPECT_FALSE(next.AfterCheckpoint(8)->has_value());
}

TEST(RegroupStatusTest, IsRecognised) {
  absl::Status st = RegroupStatus(8, "node 2 (host n2)");
  EXPECT_TRUE(IsRegroup(st));
  EXPECT_EQ(st.message(), "stopped after the checkpoint of step 8: node 2 (host n2) waits to join, and the group "
                          "restarts larger from this checkpoint");
  EXPECT_FALSE(IsRegroup(absl::AbortedError("x")));
}

}  // namespace
}  // namespace braid::launcher
