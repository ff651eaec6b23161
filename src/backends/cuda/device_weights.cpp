#include "backends/cuda/device_weights.h"

#include <algorithm>

#include "util/error.h"

namespace ms {

DeviceWeights::DeviceWeights(const ModelWeights& w) {
  auto add_mlp = [&](const MlpWeights& m) {
    add(m.gate);
    add(m.up);
    add(m.down);
  };
  auto add_layer = [&](const LayerWeights& l) {
    add(l.input_norm);
    add(l.post_attention_norm);
    if (l.type == LayerType::FullAttention) {
      add_stack({&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj});
      add(l.attn.o_proj);
      add(l.attn.q_norm);
      add(l.attn.k_norm);
    } else {
      add_stack({&l.linear.in_proj_qkvz, &l.linear.in_proj_ba});
      add(l.linear.out_proj);
      for (const auto* v : {&l.linear.conv1d, &l.linear.A, &l.linear.dt_bias, &l.linear.norm}) add(*v);
    }
    if (!l.moe) return add_mlp(l.ffn.dense);
    if (l.ffn.shared_expert.gate.data) {
      add_stack({&l.ffn.router, &l.ffn.shared_expert_gate});
      add_mlp(l.ffn.shared_expert);
    } else {
      add(l.ffn.router);
    }
    for (const MlpWeights& e : l.ffn.experts) add_mlp(e);
  };
  for (const LayerWeights& l : w.layers) add_layer(l);
  add(w.final_norm);
  add(w.lm_head);
  if (w.mtp) {
    add(w.mtp->fc);
    for (const auto* v : {&w.mtp->pre_fc_norm_embedding, &w.mtp->pre_fc_norm_hidden, &w.mtp->norm}) add(*v);
    add_layer(w.mtp->layer);
  }
}

namespace {
size_t row_bytes(const Mat& m) {
  if (m.type == WeightType::Affine) return m.quant().row_bytes();
  return size_t(m.cols) * (m.type == WeightType::BF16 ? 2 : 4);
}
size_t row_groups(const Mat& m) { return m.type == WeightType::Affine ? size_t(m.cols / m.group) : 0; }
// Bytes of a row's scales (or biases): its groups' entries.
size_t row_scale_bytes(const Mat& m) {
  return m.type == WeightType::Affine ? row_groups(m) * scale_size(m.scale_type) : 0;
}

// Whether parts can be one matrix of their rows on the GPU: one format and width, each part's
// rows starting 16-byte aligned (cuda::matmul's rule) and its scales 8 (its wide scale loads).
bool stackable(const std::vector<const Mat*>& parts) {
  const Mat& a = *parts[0];
  for (const Mat* m : parts) {
    if (!m->data || m->type != a.type || m->cols != a.cols || m->bits != a.bits || m->group != a.group ||
        m->scale_type != a.scale_type)
      return false;
  }
  size_t rows = 0;
  for (const Mat* m : parts) {
    if (rows * row_bytes(a) % 16 != 0 || rows * row_scale_bytes(a) % 8 != 0) return false;
    rows += size_t(m->rows);
  }
  return true;
}
}  // namespace

// The parts' rows, in order, in one set of device buffers: the whole, and each part a view of it.
void DeviceWeights::upload_rows(const std::vector<const Mat*>& parts) {
  const Mat& a = *parts[0];
  size_t rows = 0;
  for (const Mat* m : parts) rows += size_t(m->rows);
  auto upload = [&](size_t per_row, auto field) {
    cuda::DeviceArray<unsigned char> buf(rows * per_row);
    size_t at = 0;
    for (const Mat* m : parts) {
      cuda::copy_to_device(buf.data() + at, field(*m), size_t(m->rows) * per_row);
      at += size_t(m->rows) * per_row;
    }
    bytes_ += buf.size();
    buffers_.push_back(std::move(buf));
    return buffers_.back().data();
  };
  Mat whole = a;
  whole.rows = int(rows);
  whole.data = upload(row_bytes(a), [](const Mat& m) { return m.data; });
  if (a.type == WeightType::Affine) {
    whole.scales = reinterpret_cast<const uint16_t*>(upload(row_scale_bytes(a), [](const Mat& m) { return m.scales; }));
    whole.biases = reinterpret_cast<const uint16_t*>(upload(row_scale_bytes(a), [](const Mat& m) { return m.biases; }));
  }
  size_t row = 0;
  for (const Mat* m : parts) {
    Mat view = whole;
    view.rows = m->rows;
    view.data = static_cast<const unsigned char*>(whole.data) + row * row_bytes(a);
    if (a.type == WeightType::Affine) {
      view.scales = scale_entry(whole.scales, row * row_groups(a), a.scale_type);
      view.biases = scale_entry(whole.biases, row * row_groups(a), a.scale_type);
    }
    mats_.emplace(m->data, view);
    row += size_t(m->rows);
  }
  if (parts.size() > 1) {
    Stack& st = stacks_[a.data];
    st.whole = whole;
    for (const Mat* m : parts) st.parts.push_back(m->data);
  }
}

void DeviceWeights::add(const Mat& m) {
  if (!m.data || mats_.count(m.data)) return;  // absent, or the tied lm_head
  upload_rows({&m});
}

void DeviceWeights::add_stack(const std::vector<const Mat*>& parts) {
  if (!stackable(parts) || std::any_of(parts.begin(), parts.end(), [&](const Mat* m) { return mats_.count(m->data); })) {
    for (const Mat* m : parts) add(*m);
    return;
  }
  upload_rows(parts);
}

const Mat* DeviceWeights::stacked(std::initializer_list<const Mat*> parts) const {
  auto it = stacks_.find((*parts.begin())->data);
  if (it == stacks_.end() || !std::equal(parts.begin(), parts.end(), it->second.parts.begin(), it->second.parts.end(),
                                         [](const Mat* m, const void* p) { return m->data == p; }))
    return nullptr;
  return &it->second.whole;
}

void DeviceWeights::add(const std::vector<float>& v) {
  if (v.empty()) return;
  buffers_.push_back(cuda::DeviceArray<unsigned char>::from(reinterpret_cast<const unsigned char*>(v.data()), v.size() * 4));
  bytes_ += v.size() * 4;
  vecs_.emplace(v.data(), reinterpret_cast<const float*>(buffers_.back().data()));
}

void DeviceWeights::add_embedding(const Mat& embed, uint64_t room) {
  if (has(embed) || embed.type == WeightType::F32) return;  // has: the tied lm_head
  const size_t table = size_t(embed.rows) * (row_bytes(embed) + 2 * row_scale_bytes(embed));
  if (table <= room) add(embed);
}

const Mat& DeviceWeights::mat(const Mat& host) const {
  auto it = mats_.find(host.data);
  if (it == mats_.end()) fail("a [{}, {}] matrix the forward uses was not copied to the GPU", host.rows, host.cols);
  return it->second;
}

const float* DeviceWeights::vec(const std::vector<float>& host) const {
  auto it = vecs_.find(host.data());
  if (it == vecs_.end()) fail("a vector of {} floats the forward uses was not copied to the GPU", host.size());
  return it->second;
}

}  // namespace ms
