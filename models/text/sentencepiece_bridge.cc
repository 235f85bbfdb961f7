// libbraid_sentencepiece.so: the functions of sentencepiece_bridge.h over libsentencepiece.
#include "models/text/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

char* Copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

const sentencepiece::SentencePieceProcessor& P(const void* m) {
  return *static_cast<const sentencepiece::SentencePieceProcessor*>(m);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* braid_spm_load(const char* data, size_t size,
                                                            char** error) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  sentencepiece::util::Status s = p->LoadFromSerializedProto(std::string_view(data, size));
  if (!s.ok()) {
    *error = Copy(s.ToString());
    delete p;
    return nullptr;
  }
  return p;
}

__attribute__((visibility("default"))) void braid_spm_free(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

__attribute__((visibility("default"))) int braid_spm_vocab_size(const void* model) {
  return P(model).GetPieceSize();
}

__attribute__((visibility("default"))) int braid_spm_eos_id(const void* model) {
  return P(model).eos_id();
}

__attribute__((visibility("default"))) int braid_spm_encode(const void* model, const char* text,
                                                            size_t size, int** ids,
                                                            size_t* n_ids, char** error) {
  std::vector<int> out;
  sentencepiece::util::Status s = P(model).Encode(std::string_view(text, size), &out);
  if (!s.ok()) {
    *error = Copy(s.ToString());
    return 1;
  }
  *n_ids = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.size() + 1)));
  std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 0;
}

__attribute__((visibility("default"))) int braid_spm_decode(const void* model, const int* ids,
                                                            size_t n_ids, char** text,
                                                            size_t* size, char** error) {
  std::string out;
  sentencepiece::util::Status s = P(model).Decode(std::vector<int>(ids, ids + n_ids), &out);
  if (!s.ok()) {
    *error = Copy(s.ToString());
    return 1;
  }
  *size = out.size();
  *text = Copy(out);
  return 0;
}

__attribute__((visibility("default"))) void braid_spm_free_buffer(void* buffer) {
  std::free(buffer);
}

}  // extern "C"
