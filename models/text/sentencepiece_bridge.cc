#include "models/text/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>

namespace braid::text::spm {

class Model {
 public:
  sentencepiece::SentencePieceProcessor processor;
};

void ModelDeleter::operator()(Model* m) const { delete m; }

ModelPtr Load(const std::string& serialized, std::string* error) {
  ModelPtr m(new Model());
  sentencepiece::util::Status s = m->processor.LoadFromSerializedProto(serialized);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return m;
}

int VocabSize(const Model& m) { return m.processor.GetPieceSize(); }

bool Encode(const Model& m, std::string_view text, std::vector<int>* ids, std::string* error) {
  sentencepiece::util::Status s = m.processor.Encode(text, ids);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

bool Decode(const Model& m, const std::vector<int>& ids, std::string* text, std::string* error) {
  sentencepiece::util::Status s = m.processor.Decode(ids, text);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

}  // namespace braid::text::spm
