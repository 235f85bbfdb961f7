// The C interface of libbraid_sentencepiece.so, the one piece of Braid that links Debian's
// libsentencepiece. Two clashes keep that library out of Braid's own binaries:
//   - it carries its own protobuf 3.14 runtime and exports its symbols: in a process that also
//     links Debian's libprotobuf 3.21 (anything with //core) the first call dies in protobuf's
//     version check. Loaded with RTLD_DEEPBIND, the library binds to its own copy;
//   - its header aliases absl::string_view to std::string_view, which Debian's Abseil defines
//     as a class of its own.
// So sentencepiece_tokenizer.cc dlopens the .so and calls these functions; no Abseil, no
// protobuf, no C++ types cross.
#ifndef BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_
#define BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_

#include <stddef.h>

extern "C" {

// A model from a serialized ModelProto (a .model file's bytes), or null with *error set (free
// it with braid_spm_free_buffer).
typedef void* (*braid_spm_load_fn)(const char* data, size_t size, char** error);
typedef void (*braid_spm_free_fn)(void* model);
typedef int (*braid_spm_vocab_size_fn)(const void* model);
// The model's end-of-sentence id (</s>), or -1 when it has none.
typedef int (*braid_spm_eos_id_fn)(const void* model);
// *ids (n_ids ints) or *error, either freed with braid_spm_free_buffer; 0 on success.
typedef int (*braid_spm_encode_fn)(const void* model, const char* text, size_t size, int** ids,
                                   size_t* n_ids, char** error);
// *text (*size bytes) or *error, either freed with braid_spm_free_buffer; 0 on success.
typedef int (*braid_spm_decode_fn)(const void* model, const int* ids, size_t n_ids, char** text,
                                   size_t* size, char** error);
typedef void (*braid_spm_free_buffer_fn)(void* buffer);

}  // extern "C"

#endif  // BRAID_MODELS_TEXT_SENTENCEPIECE_BRIDGE_H_
