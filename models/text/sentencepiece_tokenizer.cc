#include "models/text/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "models/text/sentencepiece_bridge.h"
#include "third_party/runfiles.h"

namespace braid::text {

constexpr char kLibName[] = "libbraid_sentencepiece.so";

struct SentencePieceTokenizer::Library {
  braid_spm_load_fn load;
  braid_spm_free_fn free;
  braid_spm_vocab_size_fn vocab_size;
  braid_spm_eos_id_fn eos_id;
  braid_spm_encode_fn encode;
  braid_spm_decode_fn decode;
  braid_spm_free_buffer_fn free_buffer;
};

namespace {

std::string ExePath() {
  char buf[PATH_MAX];
  return ::realpath("/proc/self/exe", buf) != nullptr ? buf : "";
}

// Where the library may be: $BRAID_SENTENCEPIECE_LIB, the program's runfiles (a Bazel target
// that depends on :sentencepiece has it there), then beside the program (a copied binary).
std::vector<std::string> Candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("BRAID_SENTENCEPIECE_LIB"); env != nullptr && *env) {
    c.push_back(env);
  }
  const std::string exe = ExePath();
  std::string error;
  std::unique_ptr<bazel::tools::cpp::runfiles::Runfiles> rf(
      bazel::tools::cpp::runfiles::Runfiles::Create(exe, &error));
  if (rf != nullptr) c.push_back(rf->Rlocation(absl::StrCat("braid/models/text/", kLibName)));
  c.push_back(exe.substr(0, exe.find_last_of('/') + 1) + kLibName);
  return c;
}

absl::StatusOr<const SentencePieceTokenizer::Library*> LoadLibrary() {
  static absl::StatusOr<const SentencePieceTokenizer::Library*>* loaded = [] {
    std::string tried;
    for (const std::string& path : Candidates()) {
      // RTLD_DEEPBIND: the library's references bind to its own protobuf runtime first, not to
      // the process's libprotobuf (sentencepiece_bridge.h).
      void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h == nullptr) {
        absl::StrAppend(&tried, tried.empty() ? "" : ", ", path);
        continue;
      }
      auto* lib = new SentencePieceTokenizer::Library{
          reinterpret_cast<braid_spm_load_fn>(::dlsym(h, "braid_spm_load")),
          reinterpret_cast<braid_spm_free_fn>(::dlsym(h, "braid_spm_free")),
          reinterpret_cast<braid_spm_vocab_size_fn>(::dlsym(h, "braid_spm_vocab_size")),
          reinterpret_cast<braid_spm_eos_id_fn>(::dlsym(h, "braid_spm_eos_id")),
          reinterpret_cast<braid_spm_encode_fn>(::dlsym(h, "braid_spm_encode")),
          reinterpret_cast<braid_spm_decode_fn>(::dlsym(h, "braid_spm_decode")),
          reinterpret_cast<braid_spm_free_buffer_fn>(::dlsym(h, "braid_spm_free_buffer"))};
      if (!lib->load || !lib->free || !lib->vocab_size || !lib->eos_id || !lib->encode || !lib->decode ||
          !lib->free_buffer) {
        return new absl::StatusOr<const SentencePieceTokenizer::Library*>(
            absl::FailedPreconditionError(absl::StrCat(path, " lacks braid_spm_* functions")));
      }
      return new absl::StatusOr<const SentencePieceTokenizer::Library*>(lib);
    }
    return new absl::StatusOr<const SentencePieceTokenizer::Library*>(
        absl::FailedPreconditionError(absl::StrCat(
            "SentencePiece support (", kLibName, ") not found (tried ", tried,
            "): run the program through Bazel, copy the library beside it, or set "
            "BRAID_SENTENCEPIECE_LIB")));
  }();
  return *loaded;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const Library* lib, void* model, std::string name)
    : lib_(lib),
      model_(model),
      name_(std::move(name)),
      vocab_size_(static_cast<uint32_t>(lib->vocab_size(model))) {
  const int eos = lib->eos_id(model);
  if (eos >= 0 && uint32_t(eos) < vocab_size_) eos_id_ = uint32_t(eos);
}

SentencePieceTokenizer::~SentencePieceTokenizer() { lib_->free(model_); }

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it (", std::strerror(errno), ")"));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  absl::StatusOr<const Library*> lib = LoadLibrary();
  if (!lib.ok()) return lib.status();
  char* error = nullptr;
  void* model = (*lib)->load(bytes.data(), bytes.size(), &error);
  if (model == nullptr || (*lib)->vocab_size(model) <= 0) {
    std::string why = error != nullptr ? error : "no pieces";
    if (error != nullptr) (*lib)->free_buffer(error);
    if (model != nullptr) (*lib)->free(model);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model (", why, ")"));
  }
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(*lib, model, "sentencepiece:" + base));
}

void SentencePieceTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* ids) const {
  int* out = nullptr;
  size_t n = 0;
  char* error = nullptr;
  // Encoding fails only without a loaded model, which Load rules out.
  if (lib_->encode(model_, text.data(), text.size(), &out, &n, &error) != 0) {
    lib_->free_buffer(error);
    return;
  }
  ids->insert(ids->end(), out, out + n);
  lib_->free_buffer(out);
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::vector<int> in(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the ", name_, " vocabulary (",
                                                     vocab_size_, ")"));
    }
    in[i] = static_cast<int>(ids[i]);
  }
  char* text = nullptr;
  char* error = nullptr;
  size_t size = 0;
  if (lib_->decode(model_, in.data(), in.size(), &text, &size, &error) != 0) {
    std::string why = error;
    lib_->free_buffer(error);
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", why));
  }
  std::string out(text, size);
  lib_->free_buffer(text);
  return out;
}

}  // namespace braid::text
