// SPDX-License-Identifier: Apache-2.0
// The reference model's files: where they are looked for, and loading them
// (or a random stand-in of the same shape). Used by the reference engine and
// by every command and benchmark that runs the reference transformer; it
// needs the core's model code only, not the C ABI.
// Thread-safety: plain functions and values.
#pragma once

#include <memory>
#include <string>

#include "lab/model/checkpoint.h"
#include "lab/model/tokenizer.h"
#include "core/util/status.h"

namespace kdn::refengine {

// Where the reference model is looked for: $KDN_MODELS, the build's
// configured folder (the repository's models/), then ../shared/models.
std::string DefaultModelsDir();

// A loaded model and tokenizer, or the randomly initialised stand-in.
struct LoadedModel {
  std::unique_ptr<model::Checkpoint> weights;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::string fingerprint;  // identifies weights and tokenizer
  bool random = false;      // true: no model file, random weights
  std::string description;
};

// Loads `model_path` / `tokenizer_path` (empty = defaults). When the default
// model is absent and `allow_random` is set, returns a random model of the
// stories260K shape with a byte-level tokenizer instead.
Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path, bool allow_random);

}  // namespace kdn::refengine
