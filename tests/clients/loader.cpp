// The libtorch client of tests/clients: what a C++ user of ptconvert's TorchScript and
// AOTInductor files writes, nothing of ptconvert in it. tools/client_venv.py compiles it
// against the libtorch of a torch wheel (.clients/loader).
//
//   loader torchscript FILE.pt  INPUTS OUTPUTS  torch::jit::load, forward(inputs...)
//   loader aoti        FILE.pt2 INPUTS OUTPUTS  AOTIModelPackageLoader, run(inputs)
//   loader generate    FILE.pt2 INPUTS OUTPUTS  a greedy loop over a generation package
//
// INPUTS is what Python's torch.save writes of a list of tensors (torch::jit::pickle_load reads it);
// OUTPUTS is written by torch::jit::pickle_save, for torch.load: the tuple of the outputs' tensors
// (torchscript: a dict's values in order; aoti), the prompt and the generated tokens (generate).
// generate's INPUTS: [input_ids (batch x prompt, int64), steps (int64 scalar)]; the package
// takes input_ids and cache_position and returns the logits, its cache in buffers it keeps
// between calls; position 0 starts a new sequence.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<at::Tensor> read_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value = torch::jit::pickle_load(bytes);
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& item : value.toList().vec()) tensors.push_back(item.toTensor());
  return tensors;
}

void write_value(const std::string& path, const c10::IValue& value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// a tuple: torch.load(weights_only=True) reads it (a typed List<Tensor> pickles as
// torch.jit._pickle.build_tensorlist, which it refuses)
c10::IValue tensor_tuple(const std::vector<at::Tensor>& tensors) {
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(tensors.begin(), tensors.end()));
}

// a forward's value as its tensors, in order: a tensor, a tuple or list, a dict's values
void flatten(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) flatten(item, out);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toList().vec()) flatten(item, out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) flatten(entry.value(), out);
  } else {
    throw std::runtime_error("an output that is not a tensor: " + value.tagKind());
  }
}

c10::IValue run_torchscript(const std::string& file, const std::vector<at::Tensor>& inputs) {
  torch::jit::Module module = torch::jit::load(file);
  module.eval();
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> outputs;
  flatten(module.forward(args), outputs);
  return tensor_tuple(outputs);
}

c10::IValue run_aoti(const std::string& file, const std::vector<at::Tensor>& inputs) {
  torch::inductor::AOTIModelPackageLoader loader(file);
  return tensor_tuple(loader.run(inputs));
}

// Greedy decoding: the whole prompt at positions 0..n-1, then one token a step; the next
// token is the argmax of the last position's logits.
c10::IValue generate(const std::string& file, const std::vector<at::Tensor>& inputs) {
  torch::inductor::AOTIModelPackageLoader loader(file);
  at::Tensor ids = inputs.at(0).to(at::kLong);
  int64_t steps = inputs.at(1).item<int64_t>();
  at::Tensor tokens = ids;
  at::Tensor step_ids = ids;
  int64_t position = 0;
  for (int64_t i = 0; i < steps; ++i) {
    int64_t n = step_ids.size(1);
    at::Tensor cache_position = at::arange(position, position + n, at::kLong);
    std::vector<at::Tensor> out = loader.run({step_ids, cache_position});
    at::Tensor next = out.at(0).select(1, n - 1).argmax(-1).unsqueeze(1).to(at::kLong);
    tokens = at::cat({tokens, next}, 1);
    step_ids = next;
    position += n;
  }
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: loader torchscript|aoti|generate FILE INPUTS OUTPUTS\n";
    return 2;
  }
  std::string mode = argv[1];
  try {
    std::vector<at::Tensor> inputs = read_tensors(argv[3]);
    c10::IValue result;
    if (mode == "torchscript") {
      result = run_torchscript(argv[2], inputs);
    } else if (mode == "aoti") {
      result = run_aoti(argv[2], inputs);
    } else if (mode == "generate") {
      result = generate(argv[2], inputs);
    } else {
      std::cerr << "unknown mode " << mode << "\n";
      return 2;
    }
    write_value(argv[4], result);
  } catch (const std::exception& e) {
    std::cerr << "loader " << mode << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
