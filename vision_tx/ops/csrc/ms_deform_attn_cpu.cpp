// Multi-scale deformable attention on the CPU (vision_tx/ops/ms_deform_attn.py): the bilinear gather-sum of each
// query, and its backward, as one loop each. Sampling follows grid_sample with align_corners=False and zeros
// outside the level, as the PyTorch version does.
//
// value [B, S, heads, dim] (the levels' tokens, highest resolution first), shapes (h0, w0, h1, w1, ...),
// locations [B, Q, heads, L, P, 2] (x, y in [0, 1]), weights [B, Q, heads, L, P] -> output [B, Q, heads * dim].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "vector_clones.h"

namespace {

// A sample's four neighbours (top-left, top-right, bottom-left, bottom-right): their token index in the value
// table (-1 outside the level) and bilinear weight, and the sample's position between them.
template <typename scalar_t>
struct Neighbours {
  bool touches_level;  // false when the 2x2 neighbourhood lies wholly outside the level, or the location is NaN
  bool nan;            // the location is NaN: it reads nothing, and its query's output is NaN (as in PyTorch's version)
  int64_t token[4];
  scalar_t weight[4];
  scalar_t fx, fy;
};

template <typename scalar_t>
inline Neighbours<scalar_t> neighbours(scalar_t x, scalar_t y, int64_t height, int64_t width, int64_t start) {
  Neighbours<scalar_t> n;
  // grid_sample's own arithmetic (grid = 2 * location - 1, then (grid + 1) * size / 2 - 0.5), so that floor()
  // picks the pixels it picks for a sample exactly on a pixel centre.
  const scalar_t px = (x * 2 - 1 + 1) * (static_cast<scalar_t>(width) / 2) - static_cast<scalar_t>(0.5);
  const scalar_t py = (y * 2 - 1 + 1) * (static_cast<scalar_t>(height) / 2) - static_cast<scalar_t>(0.5);
  const scalar_t left = std::floor(px), top = std::floor(py);
  n.nan = std::isnan(px) || std::isnan(py);
  n.touches_level = left >= -1 && left < width && top >= -1 && top < height;
  if (!n.touches_level) return n;
  n.fx = px - left;
  n.fy = py - top;
  const scalar_t wx[2] = {1 - n.fx, n.fx}, wy[2] = {1 - n.fy, n.fy};
  for (int k = 0; k < 4; ++k) {
    const int64_t column = static_cast<int64_t>(left) + (k & 1), row = static_cast<int64_t>(top) + (k >> 1);
    const bool inside = column >= 0 && column < width && row >= 0 && row < height;
    n.token[k] = inside ? start + row * width + column : -1;
    n.weight[k] = wy[k >> 1] * wx[k & 1];
  }
  return n;
}

struct Sizes {
  int64_t batch, tokens, heads, dim, queries, levels, points;
  std::vector<int64_t> shapes, starts;  // (h, w) per level; each level's first token

  Sizes(const at::Tensor& value, const at::Tensor& locations, std::vector<int64_t> level_shapes)
      : batch(value.size(0)),
        tokens(value.size(1)),
        heads(value.size(2)),
        dim(value.size(3)),
        queries(locations.size(1)),
        levels(locations.size(3)),
        points(locations.size(4)),
        shapes(std::move(level_shapes)) {
    TORCH_CHECK(static_cast<int64_t>(shapes.size()) == 2 * levels, "ms_deform_attn: one (h, w) per level");
    int64_t start = 0;
    for (int64_t level = 0; level < levels; ++level) {
      starts.push_back(start);
      start += shapes[2 * level] * shapes[2 * level + 1];
    }
    TORCH_CHECK(start == tokens, "ms_deform_attn: the levels' sizes do not add up to the value's tokens");
  }
};

// The output rows of (image, query, head) triples [begin, end).
template <typename scalar_t>
VISION_TX_VECTOR_CLONES void forward_rows(const Sizes& s, const scalar_t* value, const scalar_t* locations,
                                          const scalar_t* weights, scalar_t* output, int64_t begin, int64_t end) {
  const int64_t row_stride = s.heads * s.dim, dim = s.dim;
  for (int64_t bqh = begin; bqh < end; ++bqh) {  // (image, query, head)
    const int64_t image = bqh / (s.queries * s.heads), head = bqh % s.heads;
    const scalar_t* table = value + image * s.tokens * row_stride + head * dim;
    scalar_t* out = output + bqh * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = 0;
    for (int64_t level = 0; level < s.levels; ++level) {
      for (int64_t point = 0; point < s.points; ++point) {
        const int64_t sample = (bqh * s.levels + level) * s.points + point;
        const auto n = neighbours<scalar_t>(locations[2 * sample], locations[2 * sample + 1], s.shapes[2 * level],
                                            s.shapes[2 * level + 1], s.starts[level]);
        if (n.nan) {
          for (int64_t d = 0; d < dim; ++d) out[d] = std::numeric_limits<scalar_t>::quiet_NaN();
        }
        if (!n.touches_level) continue;
        for (int k = 0; k < 4; ++k) {
          if (n.token[k] < 0) continue;
          const scalar_t w = weights[sample] * n.weight[k];
          const scalar_t* row = table + n.token[k] * row_stride;
          for (int64_t d = 0; d < dim; ++d) out[d] += w * row[d];
        }
      }
    }
  }
}

template <typename scalar_t>
void forward_kernel(const Sizes& s, const scalar_t* value, const scalar_t* locations, const scalar_t* weights,
                    scalar_t* output) {
  at::parallel_for(0, s.batch * s.queries * s.heads, 16, [&](int64_t begin, int64_t end) {
    forward_rows<scalar_t>(s, value, locations, weights, output, begin, end);
  });
}

// grad . row, and grad_row += w * grad, over dim channels. The dot product is summed in kLanes running sums (one per
// vector lane, then added in order), which the compiler vectorises where one running sum could not be reordered.
template <typename scalar_t>
inline scalar_t dot_and_scatter(const scalar_t* __restrict grad, const scalar_t* __restrict row,
                                scalar_t* __restrict grad_row, scalar_t w, int64_t dim) {
  constexpr int64_t kLanes = 8;
  scalar_t lanes[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      lanes[l] += grad[d + l] * row[d + l];
      grad_row[d + l] += w * grad[d + l];
    }
  }
  scalar_t dot = 0;
  for (int64_t l = 0; l < kLanes; ++l) dot += lanes[l];
  for (; d < dim; ++d) {
    dot += grad[d] * row[d];
    grad_row[d] += w * grad[d];
  }
  return dot;
}

// The gradients of the (image, head) pair bh: its rows of grad_value, and its samples' location and weight gradients.
template <typename scalar_t>
VISION_TX_VECTOR_CLONES void backward_image_head(const Sizes& s, const scalar_t* grad_output, const scalar_t* value,
                                                 const scalar_t* locations, const scalar_t* weights,
                                                 scalar_t* grad_value, scalar_t* grad_locations,
                                                 scalar_t* grad_weights, int64_t bh) {
  const int64_t row_stride = s.heads * s.dim, dim = s.dim;
  const int64_t image = bh / s.heads, head = bh % s.heads;
  const scalar_t* table = value + image * s.tokens * row_stride + head * dim;
  scalar_t* grad_table = grad_value + image * s.tokens * row_stride + head * dim;
  for (int64_t query = 0; query < s.queries; ++query) {
    const int64_t bqh = (image * s.queries + query) * s.heads + head;
    const scalar_t* grad = grad_output + bqh * dim;
    for (int64_t level = 0; level < s.levels; ++level) {
      const int64_t height = s.shapes[2 * level], width = s.shapes[2 * level + 1];
      for (int64_t point = 0; point < s.points; ++point) {
        const int64_t sample = (bqh * s.levels + level) * s.points + point;
        const auto n = neighbours<scalar_t>(locations[2 * sample], locations[2 * sample + 1], height, width,
                                            s.starts[level]);
        if (!n.touches_level) {
          const scalar_t zero_or_nan = n.nan ? std::numeric_limits<scalar_t>::quiet_NaN() : 0;
          grad_weights[sample] = grad_locations[2 * sample] = grad_locations[2 * sample + 1] = zero_or_nan;
          continue;
        }
        const scalar_t weight = weights[sample];
        scalar_t dots[4] = {0, 0, 0, 0};  // grad . each neighbour's row
        for (int k = 0; k < 4; ++k) {
          if (n.token[k] < 0) continue;
          dots[k] = dot_and_scatter(grad, table + n.token[k] * row_stride, grad_table + n.token[k] * row_stride,
                                    weight * n.weight[k], dim);
        }
        const scalar_t upper = dots[0] + (dots[1] - dots[0]) * n.fx;  // the sample's value along the top row
        const scalar_t lower = dots[2] + (dots[3] - dots[2]) * n.fx;
        grad_weights[sample] = upper + (lower - upper) * n.fy;
        // d pixel / d location is the level's size in pixels.
        grad_locations[2 * sample] = weight * ((dots[1] - dots[0]) * (1 - n.fy) + (dots[3] - dots[2]) * n.fy) * width;
        grad_locations[2 * sample + 1] = weight * (lower - upper) * height;
      }
    }
  }
}

template <typename scalar_t>
void backward_kernel(const Sizes& s, const scalar_t* grad_output, const scalar_t* value, const scalar_t* locations,
                     const scalar_t* weights, scalar_t* grad_value, scalar_t* grad_locations, scalar_t* grad_weights) {
  // One task per (image, head): no other task adds to its rows of grad_value, and its order of additions is fixed.
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      backward_image_head<scalar_t>(s, grad_output, value, locations, weights, grad_value, grad_locations,
                                    grad_weights, bh);
    }
  });
}

void check(const at::Tensor& value, const at::Tensor& locations, const at::Tensor& weights) {
  TORCH_CHECK(value.device().is_cpu() && locations.device().is_cpu() && weights.device().is_cpu(),
              "ms_deform_attn's CPU kernel: tensors on the CPU expected");
  TORCH_CHECK(value.scalar_type() == locations.scalar_type() && value.scalar_type() == weights.scalar_type(),
              "ms_deform_attn's CPU kernel: value, locations and weights of one dtype expected");
  TORCH_CHECK(value.dim() == 4 && locations.dim() == 6 && weights.dim() == 5,
              "ms_deform_attn's CPU kernel: value [B, S, heads, dim], locations [B, Q, heads, L, P, 2], "
              "weights [B, Q, heads, L, P] expected");
}

}  // namespace

namespace vision_tx {

at::Tensor ms_deform_attn_forward(at::Tensor value, std::vector<int64_t> shapes, at::Tensor locations,
                                  at::Tensor weights) {
  check(value, locations, weights);
  value = value.contiguous(), locations = locations.contiguous(), weights = weights.contiguous();
  const Sizes s(value, locations, std::move(shapes));
  auto output = at::empty({s.batch, s.queries, s.heads * s.dim}, value.options());
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "ms_deform_attn_forward", [&] {
    forward_kernel<scalar_t>(s, value.data_ptr<scalar_t>(), locations.data_ptr<scalar_t>(),
                             weights.data_ptr<scalar_t>(), output.data_ptr<scalar_t>());
  });
  return output;
}

std::vector<at::Tensor> ms_deform_attn_backward(at::Tensor grad_output, at::Tensor value,
                                                std::vector<int64_t> shapes, at::Tensor locations,
                                                at::Tensor weights) {
  check(value, locations, weights);
  grad_output = grad_output.contiguous().to(value.scalar_type());
  value = value.contiguous(), locations = locations.contiguous(), weights = weights.contiguous();
  const Sizes s(value, locations, std::move(shapes));
  auto grad_value = at::zeros_like(value);
  auto grad_locations = at::empty_like(locations);
  auto grad_weights = at::empty_like(weights);
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "ms_deform_attn_backward", [&] {
    backward_kernel<scalar_t>(s, grad_output.data_ptr<scalar_t>(), value.data_ptr<scalar_t>(),
                              locations.data_ptr<scalar_t>(), weights.data_ptr<scalar_t>(),
                              grad_value.data_ptr<scalar_t>(), grad_locations.data_ptr<scalar_t>(),
                              grad_weights.data_ptr<scalar_t>());
  });
  return {grad_value, grad_locations, grad_weights};
}

}  // namespace vision_tx
