// The weight gradient of a depthwise convolution (stride 1, no dilation, one filter a channel) on the CPU, for
// channels-last maps (vision_tx/ops/conv.py): ConvNeXt's 7x7 convolution. oneDNN's weight gradient of these runs at
// a few GFLOP/s on small maps; here each output row's products are summed over a contiguous run of channels, which
// the compiler vectorises (AVX-512 or AVX2 where the CPU has them, chosen when the library loads).
//
// input [N, H_in, W_in, C], grad_output [N, H, W, C] (channels last), kernel (kh, kw), padding (ph, pw)
// -> grad_weight [C, kh, kw]: grad_weight[c, i, j] = sum over n, y, x of
//    input[n, y + i - ph, x + j - pw, c] * grad_output[n, y, x, c]   (zero outside the input).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "vector_clones.h"

namespace {

constexpr int64_t kChannelBlock = 16;  // channels summed together: one AVX-512 register of float32
constexpr int64_t kRowBlock = 8;       // output rows a partial sum: the partial sums and their order depend on the
                                       // map alone, not on the threads, so the result is the same on any machine

struct Geometry {
  int64_t height, width, in_height, in_width, channels, kh, kw, ph, pw;
};

// acc [kh, kw, C] += the products of output rows [row_begin, row_end) (rows of all images, n * H + y) with the input.
template <typename scalar_t>
VISION_TX_VECTOR_CLONES void accumulate_rows(const scalar_t* __restrict input, const scalar_t* __restrict grad,
                                             scalar_t* __restrict acc, int64_t row_begin, int64_t row_end,
                                             const Geometry& g) {
  const int64_t channels = g.channels;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / g.height, y = row % g.height;
    const scalar_t* grad_row = grad + row * g.width * channels;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t in_y = y + i - g.ph;
      if (in_y < 0 || in_y >= g.in_height) continue;
      const scalar_t* input_row = input + (n * g.in_height + in_y) * g.in_width * channels;
      for (int64_t j = 0; j < g.kw; ++j) {
        // the output columns x whose input column x + j - pw lies inside the input
        const int64_t x_begin = std::max<int64_t>(0, g.pw - j), x_end = std::min(g.width, g.in_width + g.pw - j);
        const scalar_t* shifted = input_row + (j - g.pw) * channels;
        scalar_t* tap = acc + (i * g.kw + j) * channels;
        int64_t c0 = 0;
        for (; c0 + kChannelBlock <= channels; c0 += kChannelBlock) {
          scalar_t sum[kChannelBlock] = {};
          for (int64_t x = x_begin; x < x_end; ++x) {
            const scalar_t* a = shifted + x * channels + c0;
            const scalar_t* b = grad_row + x * channels + c0;
            for (int64_t c = 0; c < kChannelBlock; ++c) sum[c] += a[c] * b[c];
          }
          for (int64_t c = 0; c < kChannelBlock; ++c) tap[c0 + c] += sum[c];
        }
        for (int64_t x = x_begin; x < x_end; ++x) {  // the channels after the last full block
          for (int64_t c = c0; c < channels; ++c) tap[c] += shifted[x * channels + c] * grad_row[x * channels + c];
        }
      }
    }
  }
}

}  // namespace

namespace vision_tx {

at::Tensor depthwise_conv2d_weight_grad(const at::Tensor& input, const at::Tensor& grad_output, int64_t kh,
                                        int64_t kw, int64_t ph, int64_t pw) {
  TORCH_CHECK(input.device().is_cpu() && grad_output.device().is_cpu(),
              "depthwise convolution's CPU kernel: tensors on the CPU expected");
  TORCH_CHECK(input.dim() == 4 && grad_output.dim() == 4 && input.size(0) == grad_output.size(0) &&
                  input.size(3) == grad_output.size(3),
              "depthwise convolution's CPU kernel: input [N, H_in, W_in, C] and grad_output [N, H, W, C] expected");
  TORCH_CHECK(grad_output.size(1) == input.size(1) + 2 * ph - kh + 1 &&
                  grad_output.size(2) == input.size(2) + 2 * pw - kw + 1,
              "depthwise convolution's CPU kernel: grad_output's size is not a stride-1 convolution's output");
  const at::Tensor x = input.contiguous(), grad = grad_output.contiguous().to(input.scalar_type());
  const Geometry g{grad.size(1), grad.size(2), x.size(1), x.size(2), x.size(3), kh, kw, ph, pw};
  const int64_t rows = grad.size(0) * g.height, blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t taps = kh * kw * g.channels;
  at::Tensor partial = at::zeros({blocks, taps}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "depthwise_conv2d_weight_grad", [&] {
    const scalar_t* input_data = x.data_ptr<scalar_t>();
    const scalar_t* grad_data = grad.data_ptr<scalar_t>();
    scalar_t* partial_data = partial.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        accumulate_rows<scalar_t>(input_data, grad_data, partial_data + block * taps, block * kRowBlock,
                                  std::min(rows, (block + 1) * kRowBlock), g);
      }
    });
  });
  return partial.sum(0).view({kh, kw, g.channels}).permute({2, 0, 1}).unsqueeze(1).contiguous();
}

}  // namespace vision_tx
