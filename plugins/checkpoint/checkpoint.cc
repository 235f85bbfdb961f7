// The "safetensors" checkpointer: sharded, atomic, checksummed training checkpoints.
//
// <dir>/step_<N>/ holds rank<r>.safetensors (each rank's chunks, core/state_chunks.h) and
// index.json, which maps every global tensor to its shape and chunks (file, key, runs of the
// global flat index) and every file to its size and the CRC-32 of all its bytes (computed while
// the file is written, checked while it is read: shard_io.h), with each rank's `extra` strings.
// Commit protocol: every rank writes and flushes its file into step_<N>.tmp/; the ranks exchange
// their parts of the index (chunk lists and checksums: checkpoint_index.h, which also reads the
// index back, checking every value); rank 0 writes index.json last and renames the folder to
// step_<N>, then flushes the parent folder. A folder without its final name or index does not
// exist as a checkpoint. The folder must be one all ranks see (a shared file system across nodes).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/checkpointer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "plugins/checkpoint/checkpoint_index.h"
#include "plugins/checkpoint/shard_io.h"

namespace braid::checkpoint {
namespace {

constexpr char kName[] = "safetensors";

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("checkpoint: ", msg));
}
double Now() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

std::string StepDir(const std::string& dir, int64_t step) { return absl::StrCat(dir, "/step_", step); }

absl::Status SyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return Error(absl::StatusCode::kInternal, absl::StrCat("cannot open '", path, "' to flush it"));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Error(absl::StatusCode::kDataLoss, absl::StrCat("flushing '", path, "' failed"));
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  std::string at;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      at = path.substr(0, i);
      if (::mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) {
        return Error(absl::StatusCode::kPermissionDenied,
                     absl::StrCat("cannot create the checkpoint folder '", at, "'"));
      }
    }
  }
  return absl::OkStatus();
}

void RemoveTree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink(absl::StrCat(path, "/", n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

// The steps of the complete-looking checkpoints under `dir`, newest first.
std::vector<int64_t> Steps(const std::string& dir) {
  std::vector<int64_t> steps;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      int64_t s;
      if (n.rfind("step_", 0) == 0 && absl::SimpleAtoi(n.substr(5), &s)) steps.push_back(s);
    }
    ::closedir(d);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Strings (one per rank) gathered on every rank, over the communicator's byte all-gather.
absl::StatusOr<std::vector<std::string>> AllGatherStrings(const std::string& mine, Communicator& world) {
  const int n = world.size();
  Tensor len = Tensor::FromVector(std::vector<int64_t>{int64_t(mine.size())}, {1});
  Tensor lens = Tensor::Empty({n}, DType::kI64);
  BRAID_RETURN_IF_ERROR(world.AllGather(len, lens)->Wait());
  std::vector<int64_t> counts = lens.ToVector<int64_t>();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor in = Tensor::FromVector(std::vector<uint8_t>(mine.begin(), mine.end()), {int64_t(mine.size())});
  Tensor all = Tensor::Empty({total}, DType::kU8);
  BRAID_RETURN_IF_ERROR(world.AllGather(in, all, counts)->Wait());
  std::vector<uint8_t> bytes = all.ToVector<uint8_t>();
  std::vector<std::string> out;
  int64_t at = 0;
  for (int64_t c : counts) {
    out.emplace_back(bytes.begin() + at, bytes.begin() + at + c);
    at += c;
  }
  return out;
}

class SafetensorsCheckpointer : public Checkpointer {
 public:
  explicit SafetensorsCheckpointer(CheckpointOptions o) : opts_(std::move(o)) {}
  ~SafetensorsCheckpointer() override {
    if (writer_.joinable()) writer_.join();
  }

  absl::Status Save(int64_t step, const std::vector<StateChunk>& chunks,
                    const std::map<std::string, std::string>& extra, Communicator& world) override {
    const double start = Now();
    BRAID_RETURN_IF_ERROR(Wait());  // one save in flight at a time; commits the previous one
    const int rank = world.rank();
    pending_ = Pending();
    pending_.step = step;
    pending_.tmp = StepDir(opts_.dir, step) + ".tmp";
    pending_.file = absl::StrCat("rank", rank, ".safetensors");
    if (rank == 0) {
      RemoveTree(pending_.tmp);  // a previous attempt's leftovers
      BRAID_RETURN_IF_ERROR(MakeDirs(pending_.tmp));
    }
    BRAID_RETURN_IF_ERROR(world.Barrier()->Wait());  // the folder exists for everyone
    // This rank's part of the index (checkpoint_index.h: its file's index, as if it were the
    // only rank) and a snapshot of what it writes (copies: training goes on).
    pending_.part.step = step;
    pending_.part.world_size = 1;
    pending_.part.extra[0] = extra;
    int k = 0;
    for (const StateChunk& c : chunks) {
      if (!c.write) continue;
      const std::string key = absl::StrCat(c.name, "#", k++);
      // Asynchronous saves copy (training goes on and changes the state); a synchronous one
      // writes the live tensors, which nothing changes until it returns.
      Tensor snapshot = opts_.async ? c.local.Detach().Clone().Reshape({c.local.numel()})
                                    : c.local.Detach().Reshape({c.local.numel()});
      pending_.tensors[key] = snapshot;
      IndexedTensor& t = pending_.part.tensors[c.name];
      t.shape = c.global_shape;
      t.dtype = DTypeName(c.local.dtype());
      t.chunks.push_back({pending_.file, key, c.runs});
      pending_.bytes += int64_t(snapshot.nbytes());
    }
    pending_.active = true;
    written_ = false;
    const bool hold = HoldInSave(step, world);
    auto write = [this, hold] {
      const double t0 = Now();
      const std::string path = absl::StrCat(pending_.tmp, "/", pending_.file);
      if (hold) Hold(path);
      // One pass: the file's CRC-32 is computed as each piece is written.
      absl::StatusOr<ShardWritten> w = WriteShard(path, pending_.tensors, {{"format", kIndexFormat}});
      absl::Status st = w.status();
      if (w.ok()) {
        pending_.crc = w->crc32;
        pending_.size = w->bytes;
      } else if (st.code() == absl::StatusCode::kResourceExhausted) {  // ENOSPC, EDQUOT
        st = Error(st.code(), absl::StrCat(st.message(), "; the previous checkpoint is kept"));
      } else {
        st = Error(st.code(), absl::StrCat(st.message(), " (is the disk full? the previous "
                                                         "checkpoint is kept)"));
      }
      pending_.write_status = st;
      pending_.write_s = Now() - t0;
      pending_.tensors.clear();  // the snapshot's memory goes back now
      written_ = true;
    };
    MaybeKillInSave(step, world);
    if (opts_.async) {
      writer_ = std::thread(write);
      stats_.blocked_s = Now() - start;
      world_ = &world;
      return absl::OkStatus();
    }
    write();
    absl::Status st = Commit(world);
    stats_.blocked_s = Now() - start;
    return st;
  }

  absl::Status Wait() override {
    if (!pending_.active) return absl::OkStatus();
    if (writer_.joinable()) writer_.join();
    return Commit(*world_);
  }

  absl::Status Poll(Communicator& world) override {
    if (!pending_.active || !opts_.async) return absl::OkStatus();  // the same on every rank
    Tensor done = Tensor::FromVector(std::vector<int32_t>{written_.load() ? 1 : 0}, {1});
    BRAID_RETURN_IF_ERROR(world.AllReduce(done, ReduceOp::kMin)->Wait());
    if (done.ToVector<int32_t>()[0] == 0) return absl::OkStatus();
    return Wait();
  }

  absl::StatusOr<std::optional<int64_t>> Latest(Communicator& world) override {
    // Every rank reads and checks a share of the newest checkpoint's files (rank r the file rank r
    // wrote, when the world has not grown or shrunk) and keeps what it read for Load, which then
    // reads each file once in all: a resume without resharding reads every byte once.
    cache_.clear();
    cached_step_ = -1;
    std::vector<int64_t> steps = world.rank() == 0 ? Steps(opts_.dir) : std::vector<int64_t>();
    Tensor count = Tensor::FromVector(std::vector<int64_t>{int64_t(steps.size())}, {1});
    BRAID_RETURN_IF_ERROR(world.Broadcast(count, 0)->Wait());  // rank 0's listing for everyone
    steps.resize(size_t(count.ToVector<int64_t>()[0]));
    if (!steps.empty()) {
      Tensor all = Tensor::FromVector(steps, {int64_t(steps.size())});
      BRAID_RETURN_IF_ERROR(world.Broadcast(all, 0)->Wait());
      steps = all.ToVector<int64_t>();
    }
    for (int64_t step : steps) {
      bool file_level = false;  // a damaged file (named by the rank that read it), not the index
      absl::Status st = VerifyShare(StepDir(opts_.dir, step), world, &file_level);
      Tensor ok = Tensor::FromVector(std::vector<int32_t>{st.ok() ? 1 : 0}, {1});
      BRAID_RETURN_IF_ERROR(world.AllReduce(ok, ReduceOp::kMin)->Wait());
      if (ok.ToVector<int32_t>()[0] == 1) {
        cached_step_ = step;
        return std::optional<int64_t>(step);
      }
      cache_.clear();
      if (!st.ok() && (file_level || world.rank() == 0)) {
        std::fprintf(stderr, "braid: %s; trying an older checkpoint\n", std::string(st.message()).c_str());
      }
    }
    return std::optional<int64_t>();
  }

  absl::StatusOr<std::map<std::string, std::string>> Load(int64_t step, std::vector<StateChunk>& chunks,
                                                          Communicator& world) override {
    const std::string dir = StepDir(opts_.dir, step);
    BRAID_ASSIGN_OR_RETURN(CheckpointIndex index, ReadIndex(dir));
    // Files Latest read and checked for this step; any other is read (and checked) here, once.
    std::map<std::string, std::map<std::string, Tensor>> files;
    if (cached_step_ == step) files = std::move(cache_);
    cache_.clear();
    cached_step_ = -1;
    auto file = [&](const std::string& name) -> absl::StatusOr<const std::map<std::string, Tensor>*> {
      auto it = files.find(name);
      if (it == files.end()) {
        BRAID_ASSIGN_OR_RETURN(auto c, ReadIndexedFile(dir, index, name));
        it = files.emplace(name, std::move(c)).first;
      }
      return &it->second;
    };
    for (StateChunk& c : chunks) {
      auto found = index.tensors.find(c.name);
      if (found == index.tensors.end()) {
        return Error(absl::StatusCode::kNotFound,
                     absl::StrCat(dir, " has no tensor '", c.name, "' (it was written by another "
                                  "model or optimizer)"));
      }
      const IndexedTensor& t = found->second;
      if (t.shape != c.global_shape) {
        return Error(absl::StatusCode::kInvalidArgument,
                     absl::StrCat("'", c.name, "' is ", ShapeToString(t.shape), " in ", dir, " but ",
                                  ShapeToString(c.global_shape), " here"));
      }
      // Each of our elements from whichever saved chunk holds it, copied straight from the file's
      // tensor (one copy per overlapping run: a single one when the layouts agree).
      Tensor dst = c.local.Detach().Reshape({c.local.numel()});
      int64_t covered = 0;
      for (const IndexedChunk& saved : t.chunks) {
        std::vector<Overlap> overlap = Intersect(c.runs, saved.runs);
        if (overlap.empty()) continue;
        BRAID_ASSIGN_OR_RETURN(const auto* f, file(saved.file));
        auto it = f->find(saved.key);
        if (it == f->end()) {
          return Error(absl::StatusCode::kDataLoss, absl::StrCat(dir, "/", saved.file, " lacks ", saved.key));
        }
        // The index places the chunk's elements; the file must hold that many (the copies below
        // read them by position).
        if (it->second.numel() != RunsLength(saved.runs)) {
          return Error(absl::StatusCode::kDataLoss,
                       absl::StrCat(dir, "/", saved.file, "'s ", saved.key, " has ", it->second.numel(),
                                    " elements, but index.json places ", RunsLength(saved.runs)));
        }
        const Tensor src = it->second.Reshape({it->second.numel()});
        for (const Overlap& o : overlap) {
          Tensor part = dst.FlatRange(o.a_at, o.length);
          part.CopyFrom(src.FlatRange(o.b_at, o.length));
          covered += o.length;
        }
      }
      if (covered != c.local.numel()) {
        return Error(absl::StatusCode::kDataLoss,
                     absl::StrCat(dir, " covers ", covered, " of the ", c.local.numel(),
                                  " elements this rank needs of '", c.name, "'"));
      }
    }
    auto extra = index.extra.find(world.rank());
    return extra == index.extra.end() ? std::map<std::string, std::string>() : extra->second;
  }

  SaveStats last_save() const override { return stats_; }

 private:
  // A test hook (tests/distributed/checkpoint_test.sh): BRAID_FAULT=kill_in_save:N kills the last
  // rank in the middle of saving step N (its part half written, nothing committed), in the
  // group's first attempt, as a crash during a save would.
  void MaybeKillInSave(int64_t step, Communicator& world) const {
    const char* fault = std::getenv("BRAID_FAULT");
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    if (fault == nullptr || (attempt != nullptr && std::string(attempt) != "0")) return;
    if (std::string(fault) != absl::StrCat("kill_in_save:", step) || world.rank() != world.size() - 1) return;
    std::ofstream(absl::StrCat(StepDirOf(step), ".tmp/rank", world.rank(), ".safetensors")) << "partial";
    std::raise(SIGKILL);
  }
  std::string StepDirOf(int64_t step) const { return StepDir(opts_.dir, step); }

  // A fault hook for tools/chaos: BRAID_FAULT=hold_in_save:N[@A] makes the last rank, in attempt
  // A (BRAID_RESTART_COUNT, default 0), stop in the middle of writing its file of step N (on the
  // writer thread when saves are asynchronous: training goes on) and say so, until something
  // kills it: a checkpoint write in progress, for the chaos tool to SIGKILL from outside.
  static bool HoldInSave(int64_t step, const Communicator& world) {
    const char* fault = std::getenv("BRAID_FAULT");
    if (fault == nullptr || world.rank() != world.size() - 1) return false;
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    const std::string now = attempt != nullptr ? attempt : "0";
    const std::string f = fault;
    return (f == absl::StrCat("hold_in_save:", step) && now == "0") ||
           f == absl::StrCat("hold_in_save:", step, "@", now);
  }
  static void Hold(const std::string& path) {
    std::ofstream(path) << "partial";
    std::fprintf(stderr, "braid: BRAID_FAULT: holding its write of %s, partly written (pid %d), until killed\n",
                 path.c_str(), int(::getpid()));
    std::fflush(stderr);
    while (true) ::pause();
  }

  struct Pending {
    bool active = false;
    int64_t step = 0;
    std::string tmp, file;
    CheckpointIndex part;  // this rank's part of the index, its file's entry added once written
    std::map<std::string, Tensor> tensors;
    absl::Status write_status;
    uint32_t crc = 0;
    int64_t size = 0, bytes = 0;
    double write_s = 0;
  };

  // The index of checkpoint `dir`, every value checked (checkpoint_index.h): a damaged one is an
  // error naming the field, which Latest reports before it tries an older checkpoint.
  absl::StatusOr<CheckpointIndex> ReadIndex(const std::string& dir) {
    const std::string path = dir + "/index.json";
    std::ifstream in(path);
    if (!in) return Error(absl::StatusCode::kNotFound, absl::StrCat(path, " cannot be read"));
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(text.str(), path);
    if (!index.ok()) return Error(index.status().code(), std::string(index.status().message()));
    return index;
  }

  // One file of checkpoint `dir` as its index describes it, read and checked in one pass.
  absl::StatusOr<std::map<std::string, Tensor>> ReadIndexedFile(const std::string& dir,
                                                                const CheckpointIndex& index,
                                                                const std::string& name) {
    auto described = index.files.find(name);
    if (described == index.files.end()) {  // the parser checked every chunk's file: not expected
      return Error(absl::StatusCode::kDataLoss, absl::StrCat(dir, "/index.json does not describe ", name));
    }
    absl::StatusOr<std::map<std::string, Tensor>> got =
        ReadShard(absl::StrCat(dir, "/", name), described->second.bytes, described->second.crc32);
    if (!got.ok()) return Error(got.status().code(), std::string(got.status().message()));
    return got;
  }

  // This rank's share of checking checkpoint `dir`: its index, then the files assigned to it (the
  // one named rank<r> goes to rank r mod world size), kept in cache_ for Load.
  absl::Status VerifyShare(const std::string& dir, Communicator& world, bool* file_level) {
    BRAID_ASSIGN_OR_RETURN(CheckpointIndex index, ReadIndex(dir));
    int position = 0;
    for (const auto& entry : index.files) {
      const std::string& name = entry.first;
      int owner = position++;
      int r;
      if (name.rfind("rank", 0) == 0 && absl::SimpleAtoi(name.substr(4, name.find('.') - 4), &r) && r >= 0) {
        owner = r;
      }
      if (owner % world.size() != world.rank()) continue;
      absl::StatusOr<std::map<std::string, Tensor>> got = ReadIndexedFile(dir, index, name);
      if (!got.ok()) {
        *file_level = true;
        return got.status();
      }
      cache_.emplace(name, *std::move(got));
    }
    return absl::OkStatus();
  }

  // Every rank's write done: rank 0 writes the index and renames the folder into place.
  absl::Status Commit(Communicator& world) {
    pending_.active = false;
    // Everyone learns whether everyone wrote (a full disk on one rank fails the save everywhere):
    // each rank sends its part of the index as text, or kFailed when its write failed (never an
    // empty string: a zero-byte share of the all-gather is a case communicators need not handle).
    constexpr char kFailed[] = "failed";
    std::string mine = kFailed;
    if (pending_.write_status.ok()) {
      pending_.part.files[pending_.file] = {pending_.size, pending_.crc};
      mine = CheckpointIndexToJson(pending_.part);
    }
    BRAID_ASSIGN_OR_RETURN(std::vector<std::string> parts, AllGatherStrings(mine, world));
    for (size_t r = 0; r < parts.size(); ++r) {
      if (parts[r] == kFailed) {
        if (world.rank() == 0) RemoveTree(pending_.tmp);
        if (!pending_.write_status.ok()) return pending_.write_status;
        return Error(absl::StatusCode::kDataLoss,
                     absl::StrCat("rank ", r, " could not write its part of step ", pending_.step,
                                  " (its log says why); the previous checkpoint is kept"));
      }
    }
    absl::Status st = absl::OkStatus();
    if (world.rank() == 0) st = WriteIndexAndRename(parts);
    Tensor ok = Tensor::FromVector(std::vector<int32_t>{st.ok() ? 1 : 0}, {1});
    BRAID_RETURN_IF_ERROR(world.Broadcast(ok, 0)->Wait());
    if (!st.ok()) return st;
    if (ok.ToVector<int32_t>()[0] != 1) {
      return Error(absl::StatusCode::kDataLoss, absl::StrCat("rank 0 could not commit step ", pending_.step));
    }
    stats_.write_s = pending_.write_s;
    stats_.bytes = pending_.bytes;
    return absl::OkStatus();
  }

  // `parts`: every rank's part of the index (as text), in rank order.
  absl::Status WriteIndexAndRename(const std::vector<std::string>& parts) {
    const std::string path = pending_.tmp + "/index.json";
    CheckpointIndex index;
    index.step = pending_.step;
    index.world_size = int64_t(parts.size());
    for (size_t r = 0; r < parts.size(); ++r) {
      absl::StatusOr<CheckpointIndex> part =
          ParseCheckpointIndex(parts[r], absl::StrCat("rank ", r, "'s part of ", path));
      absl::Status st = part.ok() ? MergeCheckpointIndex(*part, int(r), &index) : part.status();
      if (!st.ok()) {
        return Error(absl::StatusCode::kInternal,
                     absl::StrCat("a bug: the index of step ", pending_.step, " cannot be assembled (",
                                  st.message(), "); the previous checkpoint is kept"));
      }
    }
    const std::string text = CheckpointIndexToJson(index);
    // What is committed must load: chunks that overlap across ranks (a strategy's bug) fail this
    // save, while the previous checkpoint is kept, not the resume that finds them.
    if (absl::Status reads = ParseCheckpointIndex(text, path).status(); !reads.ok()) {
      return Error(absl::StatusCode::kInternal,
                   absl::StrCat("a bug: the index of step ", pending_.step, " would not read back (",
                                reads.message(), "); the previous checkpoint is kept"));
    }
    {
      std::ofstream out(path, std::ios::trunc);
      out << text;
      out.flush();
      if (!out) {
        return Error(absl::StatusCode::kDataLoss,
                     absl::StrCat("writing '", path, "' failed (is the disk full?); the previous checkpoint is kept"));
      }
    }
    BRAID_RETURN_IF_ERROR(SyncPath(path, false));
    BRAID_RETURN_IF_ERROR(SyncPath(pending_.tmp, true));
    const std::string final_dir = StepDir(opts_.dir, pending_.step);
    RemoveTree(final_dir);  // a stale one of the same step (a rerun)
    if (::rename(pending_.tmp.c_str(), final_dir.c_str()) != 0) {
      return Error(absl::StatusCode::kInternal, absl::StrCat("cannot rename '", pending_.tmp, "' to '", final_dir, "'"));
    }
    BRAID_RETURN_IF_ERROR(SyncPath(opts_.dir, true));
    // Keep the newest keep_last complete checkpoints.
    std::vector<int64_t> steps = Steps(opts_.dir);
    for (size_t i = size_t(std::max(opts_.keep_last, 1)); i < steps.size(); ++i) {
      RemoveTree(StepDir(opts_.dir, steps[i]));
    }
    return absl::OkStatus();
  }

  CheckpointOptions opts_;
  Pending pending_;
  // What Latest read and checked of checkpoint cached_step_ (file name -> its tensors), for Load.
  std::map<std::string, std::map<std::string, Tensor>> cache_;
  int64_t cached_step_ = -1;
  std::thread writer_;
  std::atomic<bool> written_{false};
  Communicator* world_ = nullptr;
  SaveStats stats_;
};

}  // namespace
}  // namespace braid::checkpoint

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddCheckpointer(
      braid::checkpoint::kName,
      [](const braid::CheckpointOptions& o) -> absl::StatusOr<std::unique_ptr<braid::Checkpointer>> {
        if (o.dir.empty()) {
          return absl::InvalidArgumentError("checkpoint: checkpoint.dir is empty; name a folder");
        }
        absl::Status made = braid::checkpoint::MakeDirs(o.dir);
        if (!made.ok()) return made;
        return std::unique_ptr<braid::Checkpointer>(new braid::checkpoint::SafetensorsCheckpointer(o));
      });
  return s.ok() ? 0 : 1;
}
