// rankmesh as a c10d Backend: torch.distributed's calls on CPU and CUDA
// tensors, run by the rankmesh group the backend holds.
//
// Why C++: torch 2.11 cannot subclass c10d::Backend from Python, and a
// Python ProcessGroup is not a backend of any device type, so DDP's
// constructor (_verify_params_across_processes), reduce and gather never
// reach it. This file is that backend and nothing more: every torch call is
// flattened to 1-d buffers of one dtype and handed to the package's Rust
// side through a table of C functions (python/src/torch_abi.rs), with no
// Python frame and no GIL in between. The layouts RmBuf, RmCall, RmP2p and
// RmApi mirror that file's Buf, Call, P2pOp and Api.
//
// Calls run when they are made (CPU: done on return; CUDA: enqueued on the
// tensor's current stream), so their Work is complete at once, as a
// stream-ordered NCCL Work is to work on that stream. Sends and receives
// are the exception: they are held until a wait, a collective, or the end
// of a coalescing block, then run as one deadlock-free batch, so that
// isend/irecv pairs in any order complete as they do on gloo.

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rankmesh_torch {

constexpr uint32_t kAbiVersion = 1;

struct RmBuf {
  void* data;
  uint64_t numel;
};

struct RmCall {
  uint32_t op;
  uint32_t dtype;
  uint32_t reduce;
  int32_t peer;
  int32_t device;
  void* stream;
  RmBuf input;
  RmBuf output;
  const uint64_t* send_counts;
  const uint64_t* recv_counts;
};

struct RmP2p {
  uint32_t send;
  int32_t peer;
  uint32_t dtype;
  RmBuf buf;
};

struct RmApi {
  uint32_t version;
  int32_t (*run)(void*, const RmCall*, char*, size_t);
  int32_t (*batch)(void*, const RmP2p*, size_t, int32_t, void*, char*, size_t);
  void (*release)(void*);
  int32_t (*restore_interrupt)();
};

// torch_abi.rs' Code.
enum Op : uint32_t {
  kBarrier = 0,
  kAllReduce = 1,
  kReduce = 2,
  kBroadcast = 3,
  kAllGather = 4,
  kGather = 5,
  kScatter = 6,
  kReduceScatter = 7,
  kAllToAll = 8,
  kAllToAllV = 9,
  kAllGatherV = 10,
  kRefuse = 11,
  kReduceScatterV = 12,
};

constexpr int32_t kInterrupted = 9;

// rankmesh's dtype wire codes (DType::ALL), -1 for a dtype it lacks.
int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kDouble: return 1;
    case at::kHalf: return 2;
    case at::kBFloat16: return 3;
    case at::kChar: return 4;
    case at::kByte: return 5;
    case at::kInt: return 6;
    case at::kUInt32: return 7;
    case at::kLong: return 8;
    case at::kUInt64: return 9;
    case at::kFloat8_e4m3fn: return 10;
    case at::kFloat8_e5m2: return 11;
    case at::kBool: return 12;
    case at::kShort: return 13;
    case at::kUInt16: return 14;
    default: return -1;
  }
}

// torch's ReduceOp as the library's code (its ReduceOp::ALL order: sum,
// prod, min, max, avg); -1 where it has none, which the callers compose
// (bitwise ops by a gather and a fold, PREMUL_SUM by scaling).
int32_t library_reduce(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MIN: return 2;
    case c10d::ReduceOp::MAX: return 3;
    case c10d::ReduceOp::AVG: return 4;
    default: return -1;
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// A Work that is complete when made: its future holds the op's outputs.
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(outputs_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class RankmeshBackend;

// Sends and receives held for one batch.
struct Batch {
  std::vector<RmP2p> ops;
  std::vector<at::Tensor> tensors;  // kept alive until the batch has run
  int32_t device = -2;              // -2: none yet; -1: host
  bool done = false;
  std::string error;  // the batch's failure, raised by every wait on it
};

class BatchWork : public c10d::Work {
 public:
  BatchWork(RankmeshBackend* owner, std::shared_ptr<Batch> batch, c10d::OpType type,
            std::vector<at::Tensor> tensors);
  bool isCompleted() override { return batch_->done; }
  bool isSuccess() const override { return batch_->done && batch_->error.empty(); }
  bool wait(std::chrono::milliseconds) override;
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  // Backends outlive their Works in torch's use; a Work waited on after
  // its group was destroyed finds its batch already run (the destructor
  // runs what is held).
  RankmeshBackend* owner_;
  std::shared_ptr<Batch> batch_;
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Every backend with sends or receives held: a collective on any group runs
// them first, so that no peer waits on a send this rank still holds.
std::vector<RankmeshBackend*>& holding() {
  static std::vector<RankmeshBackend*> all;
  return all;
}

[[noreturn]] void raise(const RmApi* api, int32_t rc, const std::string& msg) {
  if (rc == kInterrupted) {
    pybind11::gil_scoped_acquire gil;
    if (api->restore_interrupt()) {
      throw pybind11::error_already_set();
    }
  }
  C10_THROW_ERROR(DistBackendError, msg);
}

class RankmeshBackend : public c10d::Backend {
 public:
  RankmeshBackend(const RmApi* api, uintptr_t handle, int rank, int size)
      : c10d::Backend(rank, size), api_(api), handle_(reinterpret_cast<void*>(handle)) {}

  ~RankmeshBackend() override {
    try {
      flush();
    } catch (...) {
      // A destructor cannot raise; the batch's Works carry its error.
    }
    api_->release(handle_);
  }

  const std::string getBackendName() const override { return "rankmesh"; }
  bool supportsCoalescing() const override { return true; }

  // A coalescing block holds its sends and receives like any others;
  // its end runs them.
  void startCoalescing() override { flush_all(); }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    auto batch = pending_;
    std::vector<at::Tensor> tensors = batch ? batch->tensors : std::vector<at::Tensor>{};
    if (!batch) {
      batch = std::make_shared<Batch>();
      batch->done = true;
    }
    flush();
    if (!batch->error.empty()) {
      C10_THROW_ERROR(DistBackendError, batch->error);
    }
    return c10::make_intrusive<DoneWork>(c10d::OpType::COALESCED, tensors);
  }

  // -- collectives -------------------------------------------------------
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    flush_all();
    for (auto& t : tensors) {
      reduce_into_place(t, opts.reduceOp, -1, "all_reduce");
    }
    return done(c10d::OpType::ALLREDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    flush_all();
    for (auto& t : tensors) {
      reduce_into_place(t, opts.reduceOp, -1, "all_reduce_coalesced");
    }
    return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    flush_all();
    for (auto& t : tensors) {
      reduce_into_place(t, opts.reduceOp, static_cast<int>(opts.rootRank), "reduce");
    }
    return done(c10d::OpType::REDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    flush_all();
    for (auto& t : tensors) {
      auto x = in_place(t, "broadcast");
      RmCall c = call(kBroadcast, x);
      c.peer = static_cast<int32_t>(opts.rootRank);
      c.input = buf(x);
      run(c);
    }
    return done(c10d::OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    flush_all();
    auto out = in_place(output, "all_gather_into_tensor");
    auto in = readable(input, out, "all_gather_into_tensor");
    RmCall c = call(kAllGather, in);
    c.input = buf(in);
    c.output = buf(out);
    run(c);
    return done(c10d::OpType::_ALLGATHER_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return pairwise(outputs, inputs, "all_gather_into_tensor_coalesced",
                    [&](at::Tensor& o, at::Tensor& i) { _allgather_base(o, i, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    flush_all();
    check_lists(outputs.size(), inputs.size(), "all_gather");
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto& outs = outputs[i];
      member_list(outs, "all_gather's output list");
      for (auto& o : outs) {
        in_place(o, "all_gather");
      }
      auto in = readable(inputs[i], outs[0], "all_gather");
      std::vector<uint64_t> counts;
      bool even = true;
      for (auto& o : outs) {
        counts.push_back(static_cast<uint64_t>(o.numel()));
        even = even && o.numel() == in.numel();
      }
      auto flat = at::empty({static_cast<int64_t>(total(counts))}, in.options());
      RmCall c = call(even ? kAllGather : kAllGatherV, in);
      c.input = buf(in);
      c.output = buf(flat);
      c.recv_counts = even ? nullptr : counts.data();
      run(c);
      unpack(flat, outs);
      all.insert(all.end(), outs.begin(), outs.end());
    }
    return done(c10d::OpType::ALLGATHER, all);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return allgather(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    flush_all();
    const int root = static_cast<int>(opts.rootRank);
    if (inputs.size() != 1) {
      refuse("gather takes one input tensor per rank, got " + std::to_string(inputs.size()));
    }
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> outs;
    if (getRank() == root) {
      if (outputs.size() != 1) {
        refuse("gather's destination takes one output list, got " +
               std::to_string(outputs.size()));
      }
      outs = outputs[0];
      member_list(outs, "gather's output list");
      for (auto& o : outs) {
        in_place(o, "gather");
        if (o.numel() != in.numel()) {
          refuse("gather: an output of " + std::to_string(o.numel()) +
                 " elements for an input of " + std::to_string(in.numel()));
        }
      }
    }
    auto x = readable(in, in, "gather");
    auto flat = at::empty({getRank() == root ? x.numel() * getSize() : 0}, x.options());
    RmCall c = call(kGather, x);
    c.peer = root;
    c.input = buf(x);
    c.output = buf(flat);
    run(c);
    if (getRank() == root) {
      unpack(flat, outs);
    }
    return done(c10d::OpType::GATHER, outs);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    flush_all();
    const int root = static_cast<int>(opts.rootRank);
    if (outputs.size() != 1) {
      refuse("scatter takes one output tensor per rank, got " + std::to_string(outputs.size()));
    }
    auto out = in_place(outputs[0], "scatter");
    at::Tensor flat;
    if (getRank() == root) {
      if (inputs.size() != 1) {
        refuse("scatter's source takes one input list, got " + std::to_string(inputs.size()));
      }
      member_list(inputs[0], "scatter's input list");
      for (auto& t : inputs[0]) {
        if (t.numel() != out.numel() || t.scalar_type() != out.scalar_type()) {
          refuse("scatter: an input of " + std::to_string(t.numel()) + " elements of " +
                 std::string(c10::toString(t.scalar_type())) + " for an output of " +
                 std::to_string(out.numel()) + " of " +
                 std::string(c10::toString(out.scalar_type())));
        }
      }
      flat = pack(inputs[0], out);
    } else {
      // Every member passes a tensor of the source's shape; only its are read.
      flat = at::empty({out.numel() * getSize()}, out.options());
    }
    RmCall c = call(kScatter, out);
    c.peer = root;
    c.input = buf(flat);
    c.output = buf(out);
    run(c);
    return done(c10d::OpType::SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    flush_all();
    auto out = in_place(output, "reduce_scatter_tensor");
    auto in = readable(input, out, "reduce_scatter_tensor");
    reduce_scatter_flat(in, out, opts.reduceOp, "reduce_scatter_tensor");
    return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return pairwise(outputs, inputs, "reduce_scatter_tensor_coalesced",
                    [&](at::Tensor& o, at::Tensor& i) { _reduce_scatter_base(o, i, opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    flush_all();
    check_lists(outputs.size(), inputs.size(), "reduce_scatter");
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto out = in_place(outputs[i], "reduce_scatter");
      member_list(inputs[i], "reduce_scatter's input list");
      bool even = true;
      for (auto& t : inputs[i]) {
        even = even && t.numel() == out.numel();
      }
      auto flat = pack(inputs[i], out);
      const int32_t code = library_reduce(opts.reduceOp.op_);
      if (even) {
        reduce_scatter_flat(flat, out, opts.reduceOp, "reduce_scatter");
      } else if (code >= 0) {
        // Uneven pieces (torch's list form allows them, FSDP's uneven
        // shards): reduce_scatter_v, each member's piece its own count.
        refuse_complex_order(inputs[i][0], opts.reduceOp.op_, "reduce_scatter");
        std::vector<uint64_t> counts;
        for (auto& t : inputs[i]) {
          counts.push_back(static_cast<uint64_t>(t.numel() * (t.is_complex() ? 2 : 1)));
        }
        RmCall c = call(kReduceScatterV, flat);
        c.reduce = static_cast<uint32_t>(code);
        c.input = buf(flat);
        c.output = buf(out);
        c.recv_counts = counts.data();
        run(c);
      } else {
        // Uneven pieces under a bitwise op or PREMUL_SUM: the whole reduced,
        // this member's piece kept.
        reduce_into_place(flat, opts.reduceOp, -1, "reduce_scatter");
        int64_t start = 0;
        for (int r = 0; r < getRank(); ++r) {
          start += inputs[i][r].numel();
        }
        if (inputs[i][getRank()].numel() != out.numel()) {
          refuse_after_call("reduce_scatter: this member's piece has " +
                            std::to_string(inputs[i][getRank()].numel()) +
                            " elements and its output " + std::to_string(out.numel()));
        }
        out.copy_(flat.narrow(0, start, out.numel()).view(out.sizes()));
      }
    }
    return done(c10d::OpType::REDUCE_SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions&) override {
    flush_all();
    auto out = in_place(output, "all_to_all_single");
    auto in = readable(input, out, "all_to_all_single");
    if (outputSplits.empty() && inputSplits.empty()) {
      RmCall c = call(kAllToAll, in);
      c.input = buf(in);
      c.output = buf(out);
      run(c);
    } else {
      auto send = counts_of(inputSplits, input, "input_split_sizes");
      auto recv = counts_of(outputSplits, output, "output_split_sizes");
      RmCall c = call(kAllToAllV, in);
      c.input = buf(in);
      c.output = buf(out);
      c.send_counts = send.data();
      c.recv_counts = recv.data();
      run(c);
    }
    return done(c10d::OpType::ALLTOALL_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    flush_all();
    member_list(outputs, "all_to_all's output list");
    member_list(inputs, "all_to_all's input list");
    for (auto& o : outputs) {
      in_place(o, "all_to_all");
    }
    std::vector<uint64_t> send, recv;
    for (auto& t : inputs) {
      send.push_back(static_cast<uint64_t>(t.numel()));
    }
    for (auto& t : outputs) {
      recv.push_back(static_cast<uint64_t>(t.numel()));
    }
    auto flat_in = pack(inputs, outputs[0]);
    auto flat_out = at::empty({static_cast<int64_t>(total(recv))}, flat_in.options());
    RmCall c = call(kAllToAllV, flat_in);
    c.input = buf(flat_in);
    c.output = buf(flat_out);
    c.send_counts = send.data();
    c.recv_counts = recv.data();
    run(c);
    unpack(flat_out, outputs);
    return done(c10d::OpType::ALLTOALL, outputs);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    flush_all();
    RmCall c{};
    c.op = kBarrier;
    c.device = -1;
    run(c);
    return done(c10d::OpType::BARRIER, {});
  }

  // -- point to point ----------------------------------------------------
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int) override {
    return hold(tensors, dst, true, c10d::OpType::SEND);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int) override {
    return hold(tensors, src, false, c10d::OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    C10_THROW_ERROR(DistBackendError,
                    "rankmesh: recv from any source is not supported: every receive names "
                    "its source (its dtype and size are checked against that sender's)");
  }

  // Runs the held sends and receives as one batch (per plane).
  void flush() {
    auto batch = pending_;
    if (!batch) {
      return;
    }
    pending_.reset();
    auto& all = holding();
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
    void* stream = batch->device >= 0 ? stream_of(batch->device) : nullptr;
    char err[4096];
    int32_t rc = api_->batch(handle_, batch->ops.data(), batch->ops.size(), batch->device,
                             stream, err, sizeof err);
    batch->done = true;
    if (rc != 0) {
      batch->error = err;
      raise(api_, rc, batch->error);
    }
  }

 private:
  // Sends and receives held on every backend run before any collective.
  static void flush_all() {
    auto all = holding();
    for (auto* b : all) {
      b->flush();
    }
  }

  c10::intrusive_ptr<c10d::Work> hold(std::vector<at::Tensor>& tensors, int peer, bool is_send,
                                      c10d::OpType type) {
    const char* what = is_send ? "send" : "recv";
    if (tensors.size() != 1) {
      C10_THROW_ERROR(DistBackendError, std::string("rankmesh: ") + what +
                                            " takes one tensor, got " +
                                            std::to_string(tensors.size()));
    }
    at::Tensor t = is_send ? tensors[0].contiguous() : tensors[0];
    check_local(t, what, !is_send);
    if (peer == getRank() || peer < 0 || peer >= getSize()) {
      C10_THROW_ERROR(DistBackendError,
                      std::string("rankmesh: ") + what + " with peer " + std::to_string(peer) +
                          " in a group of " + std::to_string(getSize()) + " where this rank is " +
                          std::to_string(getRank()) +
                          ": the peer must be another member of the group");
    }
    int32_t device = t.is_cuda() ? t.get_device() : -1;
    if (pending_ && pending_->device != device) {
      flush();
    }
    if (!pending_) {
      pending_ = std::make_shared<Batch>();
      pending_->device = device;
      holding().push_back(this);
    }
    RmP2p op{};
    op.send = is_send ? 1 : 0;
    op.peer = peer;
    op.dtype = static_cast<uint32_t>(dtype_code(t.scalar_type()));
    op.buf = buf(t);
    pending_->ops.push_back(op);
    pending_->tensors.push_back(t);
    return c10::make_intrusive<BatchWork>(this, pending_, type, tensors);
  }

  // A coalesced form: each (output, input) pair as its own call, and one
  // Work for them all.
  template <class Each>
  c10::intrusive_ptr<c10d::Work> pairwise(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs, const char* what,
                                          Each each) {
    check_lists(outputs.size(), inputs.size(), what);
    for (size_t i = 0; i < outputs.size(); ++i) {
      each(outputs[i], inputs[i]);
    }
    return done(c10d::OpType::COALESCED, outputs);
  }

  // all_reduce (root -1) or reduce (root >= 0) of `t` in place, every
  // torch ReduceOp: the library's five, bitwise ones by a gather and a
  // local fold, PREMUL_SUM by scaling first.
  void reduce_into_place(at::Tensor& t, const c10d::ReduceOp& rop, int root, const char* what) {
    auto x = in_place(t, what);
    const auto op = rop.op_;
    // PREMUL_SUM: scaled below, then summed.
    const int32_t code = op == c10d::ReduceOp::PREMUL_SUM ? 0 : library_reduce(op);
    if (t.is_complex() && op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG &&
        op != c10d::ReduceOp::PREMUL_SUM) {
      refuse(std::string(what) + " with ReduceOp." + op_name(op) + " on " +
             c10::toString(t.scalar_type()) + ": complex numbers have no order or "
             "element-wise product here (SUM, AVG and PREMUL_SUM only)");
    }
    if (op == c10d::ReduceOp::PREMUL_SUM) {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      if (s == nullptr) {
        refuse(std::string(what) + " with ReduceOp.PREMUL_SUM but no factor");
      }
      if (s->tensor_factor.defined()) {
        x.mul_(s->tensor_factor.to(x.device()));
      } else {
        x.mul_(s->double_factor);
      }
    }
    if (code < 0) {
      bitwise(x, op, root, what);
    } else {
      at::Tensor out = root < 0 ? x : at::empty_like(x);
      RmCall c = call(root < 0 ? kAllReduce : kReduce, x);
      c.reduce = static_cast<uint32_t>(code);
      c.peer = root;
      c.input = buf(x);
      c.output = buf(out);
      run(c);
      if (root >= 0 && getRank() == root) {
        x.copy_(out);
      }
    }
  }

  void bitwise(at::Tensor& x, c10d::ReduceOp::RedOpType op, int root, const char* what) {
    if (at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type())) {
      refuse(std::string(what) + " with ReduceOp." + op_name(op) + " on " +
             c10::toString(x.scalar_type()) +
             ": bitwise reductions take integer or bool tensors");
    }
    if (op != c10d::ReduceOp::BAND && op != c10d::ReduceOp::BOR &&
        op != c10d::ReduceOp::BXOR) {
      refuse(std::string(what) + " with ReduceOp." + op_name(op) + ": not a reduction");
    }
    auto all = at::empty({x.numel() * getSize()}, x.options());
    RmCall c = call(kAllGather, x);
    c.input = buf(x);
    c.output = buf(all);
    run(c);
    if (root >= 0 && getRank() != root) {
      return;
    }
    auto rows = all.view({getSize(), x.numel()});
    auto acc = rows[0].clone();
    for (int r = 1; r < getSize(); ++r) {
      if (op == c10d::ReduceOp::BAND) {
        acc.bitwise_and_(rows[r]);
      } else if (op == c10d::ReduceOp::BOR) {
        acc.bitwise_or_(rows[r]);
      } else {
        acc.bitwise_xor_(rows[r]);
      }
    }
    x.copy_(acc.view(x.sizes()));
  }

  // Complex numbers have no order and no element-wise product here.
  void refuse_complex_order(const at::Tensor& t, c10d::ReduceOp::RedOpType op, const char* what) {
    if (t.is_complex() && op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG) {
      refuse(std::string(what) + " with ReduceOp." + op_name(op) + " on complex numbers");
    }
  }

  void reduce_scatter_flat(at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& rop,
                           const char* what) {
    const auto op = rop.op_;
    const int32_t code = library_reduce(op);
    if (code >= 0) {
      refuse_complex_order(in, op, what);
      RmCall c = call(kReduceScatter, in);
      c.reduce = static_cast<uint32_t>(code);
      c.input = buf(in);
      c.output = buf(out);
      run(c);
      return;
    }
    // Bitwise and PREMUL_SUM: the whole reduced, this member's slice kept.
    auto whole = in.clone();
    reduce_into_place(whole, rop, -1, what);
    if (whole.numel() != out.numel() * getSize()) {
      refuse_after_call(std::string(what) + ": an input of " + std::to_string(whole.numel()) +
                        " elements for an output of " + std::to_string(out.numel()) +
                        " in a group of " + std::to_string(getSize()));
    }
    out.copy_(whole.narrow(0, out.numel() * getRank(), out.numel()).view(out.sizes()));
  }

  // -- tensors -----------------------------------------------------------
  // `t` as the flat buffer an op writes: refused when it cannot be written
  // where it lies. A complex tensor travels as its real pairs.
  at::Tensor in_place(const at::Tensor& t, const char* what) {
    check_local(t, what, true);
    auto x = t.is_complex() ? at::view_as_real(t) : t;
    return x.reshape({-1});
  }

  // An input: a contiguous view, or a contiguous copy; its device and
  // dtype must be `like`'s.
  at::Tensor readable(const at::Tensor& t, const at::Tensor& like, const char* what) {
    check_local(t, what, false);
    if (t.device() != like.device()) {
      refuse(std::string(what) + ": the input is on " + t.device().str() +
             " and the output on " + like.device().str());
    }
    auto x = t.is_complex() ? at::view_as_real(t.contiguous()) : t.contiguous();
    return x.reshape({-1});
  }

  void check_local(const at::Tensor& t, const char* what, bool written) {
    std::string why;
    if (!t.defined()) {
      why = "an undefined tensor";
    } else if (t.layout() != at::kStrided) {
      why = "a sparse tensor (rankmesh moves dense ones)";
    } else if (!t.is_cpu() && !t.is_cuda()) {
      why = "a tensor on " + t.device().str() + " (rankmesh moves CPU and CUDA memory)";
    } else if (dtype_code(t.is_complex() ? c10::toRealValueType(t.scalar_type())
                                         : t.scalar_type()) < 0) {
      why = std::string("a tensor of ") + c10::toString(t.scalar_type()) +
            " (rankmesh moves float32, float64, float16, bfloat16, int8, uint8, int16, "
            "uint16, int32, uint32, int64, uint64, bool, float8_e4m3fn, float8_e5m2 and the "
            "complex types of its floats)";
    } else if (written && !t.is_contiguous()) {
      why = "a non-contiguous tensor to write in place (its strides are " +
            c10::str(t.strides()) + "): pass a contiguous one (t.contiguous()) and copy back";
    }
    if (!why.empty()) {
      refuse(std::string(what) + " on this rank got " + why);
    }
  }

  void member_list(const std::vector<at::Tensor>& list, const std::string& what) {
    if (static_cast<int>(list.size()) != getSize()) {
      refuse(what + " has " + std::to_string(list.size()) + " tensors for a group of " +
             std::to_string(getSize()));
    }
  }

  void check_lists(size_t outs, size_t ins, const char* what) {
    if (outs != ins) {
      refuse(std::string(what) + ": " + std::to_string(outs) + " outputs for " +
             std::to_string(ins) + " inputs");
    }
  }

  // One flat tensor of `list`'s elements, in `like`'s dtype and device.
  at::Tensor pack(const std::vector<at::Tensor>& list, const at::Tensor& like) {
    std::vector<at::Tensor> flat;
    for (auto& t : list) {
      if (t.device() != like.device() || t.scalar_type() != like.scalar_type()) {
        refuse("a list of tensors on " + t.device().str() + " of " +
               std::string(c10::toString(t.scalar_type())) + " beside an output on " +
               like.device().str() + " of " + std::string(c10::toString(like.scalar_type())));
      }
      check_local(t, "a list's tensor", false);
      auto x = t.is_complex() ? at::view_as_real(t.contiguous()) : t.contiguous();
      flat.push_back(x.reshape({-1}));
    }
    return at::cat(flat);
  }

  static void unpack(const at::Tensor& flat, std::vector<at::Tensor>& outs) {
    int64_t start = 0;
    for (auto& o : outs) {
      auto x = o.is_complex() ? at::view_as_real(o) : o;
      x.copy_(flat.narrow(0, start, x.numel()).view(x.sizes()));
      start += x.numel();
    }
  }

  std::vector<uint64_t> counts_of(const std::vector<int64_t>& splits, const at::Tensor& t,
                                  const char* what) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row = rows == 0 ? 0 : t.numel() / rows;
    const int64_t per = t.is_complex() ? 2 : 1;
    std::vector<uint64_t> out;
    if (splits.empty()) {
      if (rows % getSize() != 0) {
        refuse(std::string("all_to_all_single: no ") + what + " and dim 0 of " +
               std::to_string(rows) + " does not divide by the group's " +
               std::to_string(getSize()));
      }
      out.assign(getSize(), static_cast<uint64_t>(rows / getSize() * row * per));
      return out;
    }
    if (static_cast<int>(splits.size()) != getSize()) {
      refuse(std::string("all_to_all_single: ") + what + " has " +
             std::to_string(splits.size()) + " entries for a group of " +
             std::to_string(getSize()));
    }
    int64_t sum = 0;
    for (auto s : splits) {
      if (s < 0) {
        refuse(std::string("all_to_all_single: a negative entry in ") + what);
      }
      sum += s;
      out.push_back(static_cast<uint64_t>(s * row * per));
    }
    if (sum != rows) {
      refuse(std::string("all_to_all_single: ") + what + " add up to " + std::to_string(sum) +
             " rows, and the tensor has " + std::to_string(rows));
    }
    return out;
  }

  static uint64_t total(const std::vector<uint64_t>& counts) {
    uint64_t n = 0;
    for (auto c : counts) {
      n += c;
    }
    return n;
  }

  static RmBuf buf(const at::Tensor& t) {
    return RmBuf{t.numel() == 0 ? nullptr : t.data_ptr(), static_cast<uint64_t>(t.numel())};
  }

  static void* stream_of(int32_t device) {
    c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    return cuda.getStream(c10::Device(c10::DeviceType::CUDA, device)).native_handle();
  }

  RmCall call(uint32_t op, const at::Tensor& like) const {
    RmCall c{};
    c.op = op;
    c.dtype = static_cast<uint32_t>(dtype_code(like.scalar_type()));
    c.peer = -1;
    c.device = like.is_cuda() ? like.get_device() : -1;
    c.stream = like.is_cuda() ? stream_of(c.device) : nullptr;
    return c;
  }

  void run(const RmCall& c) {
    char err[4096];
    int32_t rc = api_->run(handle_, &c, err, sizeof err);
    if (rc != 0) {
      raise(api_, rc, err);
    }
  }

  // A refusal of this rank's own arguments: the rank still calls in (a
  // barrier the peers' call does not match, so they fail instead of
  // waiting), then raises its own reason.
  [[noreturn]] void refuse(const std::string& why) {
    RmCall c{};
    c.op = kRefuse;
    c.device = -1;
    char err[4096];
    api_->run(handle_, &c, err, sizeof err);
    C10_THROW_ERROR(DistBackendError, "rankmesh: " + why);
  }

  // A refusal found after the collective ran on every member.
  [[noreturn]] static void refuse_after_call(const std::string& why) {
    C10_THROW_ERROR(DistBackendError, "rankmesh: " + why);
  }

  static c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> outs) {
    return c10::make_intrusive<DoneWork>(type, std::move(outs));
  }

  const RmApi* api_;
  void* handle_;
  std::shared_ptr<Batch> pending_;
};

BatchWork::BatchWork(RankmeshBackend* owner, std::shared_ptr<Batch> batch, c10d::OpType type,
                     std::vector<at::Tensor> tensors)
    : c10d::Work(-1, type), owner_(owner), batch_(std::move(batch)), tensors_(std::move(tensors)) {}

bool BatchWork::wait(std::chrono::milliseconds) {
  if (!batch_->done) {
    owner_->flush();
  }
  if (!batch_->error.empty()) {
    C10_THROW_ERROR(DistBackendError, batch_->error);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> BatchWork::getFuture() {
  if (!future_) {
    wait(std::chrono::milliseconds(0));
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(tensors_));
  }
  return future_;
}

c10::intrusive_ptr<c10d::Backend> create(pybind11::capsule api, uintptr_t handle, int rank,
                                         int size) {
  auto* table = static_cast<const RmApi*>(api.get_pointer());
  if (table == nullptr || table->version != kAbiVersion) {
    C10_THROW_ERROR(DistBackendError,
                    "rankmesh: the torch backend was built for ABI " +
                        std::to_string(kAbiVersion) + " and rankmesh._native offers " +
                        std::to_string(table ? table->version : 0) +
                        ": rebuild it (delete the cache named in rankmesh.torch.build's error)");
  }
  return c10::make_intrusive<RankmeshBackend>(table, handle, rank, size);
}

}  // namespace rankmesh_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::module_::import("torch.distributed");
  pybind11::class_<rankmesh_torch::RankmeshBackend, c10d::Backend,
                   c10::intrusive_ptr<rankmesh_torch::RankmeshBackend>>(m, "RankmeshBackend");
  m.def("create", &rankmesh_torch::create, "A c10d Backend on a rankmesh group",
        pybind11::arg("api"), pybind11::arg("handle"), pybind11::arg("rank"),
        pybind11::arg("size"));
  m.attr("ABI_VERSION") = rankmesh_torch::kAbiVersion;
}
