// The Python module of vision_tx's CPU kernels (vision_tx/ops/cpu_kernels.py builds and loads it).
#include <torch/extension.h>

#include <vector>

namespace vision_tx {
at::Tensor ms_deform_attn_forward(at::Tensor value, std::vector<int64_t> shapes, at::Tensor locations,
                                  at::Tensor weights);
std::vector<at::Tensor> ms_deform_attn_backward(at::Tensor grad_output, at::Tensor value,
                                                std::vector<int64_t> shapes, at::Tensor locations,
                                                at::Tensor weights);
at::Tensor depthwise_conv2d_weight_grad(const at::Tensor& input, const at::Tensor& grad_output, int64_t kh,
                                        int64_t kw, int64_t ph, int64_t pw);
}  // namespace vision_tx

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ms_deform_attn_forward", &vision_tx::ms_deform_attn_forward,
        "multi-scale deformable attention: (value, shapes, locations, weights) -> output");
  m.def("ms_deform_attn_backward", &vision_tx::ms_deform_attn_backward,
        "its gradients: (value, locations, weights)");
  m.def("depthwise_conv2d_weight_grad", &vision_tx::depthwise_conv2d_weight_grad,
        "a stride-1 depthwise convolution's weight gradient, channels-last: (input, grad_output, kh, kw, ph, pw) "
        "-> [C, 1, kh, kw]");
}
