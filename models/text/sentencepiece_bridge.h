// The only file that sees libsentencepiece's header: it declares `absl::string_view` as an alias
// of std::string_view, which clashes with Debian's Abseil (its own class). So this interface
// speaks std types only, and sentencepiece_tokenizer.cc, which uses Abseil, goes through it.
#ifndef BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_
#define BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace braid::text::spm {

class Model;  // a loaded sentencepiece::SentencePieceProcessor

struct ModelDeleter {
  void operator()(Model* m) const;
};
using ModelPtr = std::unique_ptr<Model, ModelDeleter>;

// A serialized ModelProto (a .model file's bytes); nullptr and `error` set when it is not one.
ModelPtr Load(const std::string& serialized, std::string* error);
int VocabSize(const Model& m);
// False and `error` set on failure.
bool Encode(const Model& m, std::string_view text, std::vector<int>* ids, std::string* error);
bool Decode(const Model& m, const std::vector<int>& ids, std::string* text, std::string* error);

}  // namespace braid::text::spm

#endif  // BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_
