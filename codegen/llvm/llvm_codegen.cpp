#include "codegen/llvm/llvm_codegen.hpp"

#include "compiler/kernel_check.hpp"
#include "ir/error.hpp"

#include <fmt/format.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // LLVM's headers
#include <llvm/ADT/STLFunctionalExtras.h>
#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <map>
#include <cstdint>
#include <limits>
#include <vector>

namespace kiln::codegen {

namespace {

using namespace llvm;
using kir::AccKind;
using kir::Op;
using CT = kir::ComputeType;

// When the innermost dim is parallel and the kernel reduces (a column reduction), every block
// runs for a tile of this many consecutive points of the last P dim, in the innermost loop:
// that loop then walks contiguous memory and vectorises, where the R loop would stride.
constexpr int64_t kTile = 512;

enum class Entry { Run, Partial, Final };

enum Arg { kSizes, kBuffers, kStrides, kFParams, kIParams, kArg5, kArg6, kArg7 };

bool is_arg(AccKind k) { return k == AccKind::ArgMax || k == AccKind::ArgMin; }
bool is_max(AccKind k) { return k == AccKind::Max || k == AccKind::ArgMax; }

std::string module_text(const Module& m) {
    std::string s;
    raw_string_ostream os(s);
    m.print(os, nullptr);
    return os.str();
}

// The kernel IR's rules (compiler/kernel_check.hpp, the checker both renderers share): a
// malformed Kernel fails here with its listing rather than as a crash or wrong code.
void check_kernel(const kir::Kernel& k) {
    if (std::string problem = kir::kernel_problem(k); !problem.empty())
        throw InternalError("llvm codegen: malformed kernel '" + k.name + "': " + problem + "\n" + kir::to_string(k));
}

class Emitter {
public:
    Emitter(const kir::Kernel& k, Module& m) : k_(k), m_(m), ctx_(m.getContext()), b_(ctx_) {
        i8_ = b_.getInt8Ty();
        i16_ = b_.getInt16Ty();
        i32_ = b_.getInt32Ty();
        i64_ = b_.getInt64Ty();
        f32_ = b_.getFloatTy();
        f64_ = b_.getDoubleTy();
        ptr_ = b_.getPtrTy();
        for (int d = 0; d < k.rank; ++d) (k.reduced[d] ? rdims_ : pdims_).push_back(d);
        tiled_ = !pdims_.empty() && !rdims_.empty() && !k.reduced[k.rank - 1];
    }

    void emit(Entry e, const std::string& name) {
        begin_function(e, name);
        switch (e) {
        case Entry::Run: body_run(); break;
        case Entry::Partial: body_partial(); break;
        case Entry::Final: body_final(); break;
        }
        b_.CreateRetVoid();
    }

private:
    const kir::Kernel& k_;
    Module& m_;
    LLVMContext& ctx_;
    IRBuilder<> b_;
    Type *i8_, *i16_, *i32_, *i64_, *f32_, *f64_, *ptr_;
    std::vector<int> pdims_, rdims_;
    bool tiled_;

    // State of the function being emitted.
    struct AccSlot {
        AllocaInst* value = nullptr;
        AllocaInst* pos = nullptr;
        Type* type = nullptr;  // of `value`: integer keys for float Max/Min (see to_key)
    };
    Function* fn_ = nullptr;
    std::vector<Value*> size_;
    std::vector<Value*> base_;
    std::vector<std::vector<Value*>> stride_;  // null where the layout says 0 or 1
    std::vector<Value*> fparam_, iparam_;
    std::map<int, Value*> dparam_, lparam_;   // 64-bit parameters, by their first slot
    std::vector<Value*> coord_;
    Value* lane_ = nullptr;   // tiled: i64 lane within the tile, inside a lane loop
    Value* lanes_ = nullptr;  // tiled: i64 lanes of the current tile
    std::vector<Value*> val_;
    std::vector<AllocaInst*> slot_;  // tiled: Point block values, one per lane
    std::vector<AccSlot> acc_;

    // ---- constants and small helpers
    Constant* i32c(int64_t v) { return ConstantInt::get(i32_, (uint64_t)v, true); }
    Constant* i64c(int64_t v) { return ConstantInt::get(i64_, (uint64_t)v, true); }
    Constant* f32c(float v) { return ConstantFP::get(f32_, v); }
    // A constant of compute type t.
    Constant* fc(CT t, double v) { return t == CT::F64 ? ConstantFP::get(f64_, v) : ConstantFP::get(f32_, (float)v); }
    Constant* ic(CT t, int64_t v) { return t == CT::I64 ? i64c(v) : i32c(v); }
    Type* type_of(CT t) {
        switch (t) {
        case CT::F32: return f32_;
        case CT::I32: return i32_;
        case CT::F64: return f64_;
        case CT::I64: return i64_;
        }
        return i32_;
    }
    static CT ct_of(Type* t) {
        return t->isFloatTy() ? CT::F32 : t->isDoubleTy() ? CT::F64 : t->isIntegerTy(64) ? CT::I64 : CT::I32;
    }
    Value* arg(int i) { return fn_->getArg(i); }
    Value* bool_i32(Value* c) { return b_.CreateZExt(c, i32_); }
    Value* is_nan(Value* x) { return b_.CreateFCmpUNO(x, x); }

    // ---- function frame
    void begin_function(Entry e, const std::string& name) {
        std::vector<Type*> params(5, ptr_);
        if (e == Entry::Final) {
            params.push_back(ptr_);
            params.push_back(i64_);
        } else {
            params.push_back(i64_);
            params.push_back(i64_);
            if (e == Entry::Partial) params.push_back(ptr_);
        }
        fn_ = Function::Create(FunctionType::get(b_.getVoidTy(), params, false), Function::ExternalLinkage, name, m_);
        fn_->addFnAttr(Attribute::NoUnwind);
        static const char* const names[] = {"sizes", "buffers", "strides", "fparams", "iparams"};
        for (int i = 0; i < 5; ++i) fn_->getArg(i)->setName(names[i]);
        if (e == Entry::Final) {
            fn_->getArg(5)->setName("partials");
            fn_->getArg(6)->setName("nchunks");
        } else {
            fn_->getArg(5)->setName("begin");
            fn_->getArg(6)->setName("end");
            if (e == Entry::Partial) fn_->getArg(7)->setName("partial");
        }
        b_.SetInsertPoint(BasicBlock::Create(ctx_, "entry", fn_));
        preload_arguments();
        make_slots();
        val_.assign(k_.instrs.size(), nullptr);
        coord_.assign(k_.rank, i64c(0));
        lane_ = lanes_ = nullptr;
    }

    // Every argument the kernel reads is loaded once, up front: the loops then see loop-invariant
    // SSA values instead of loads that a store to an output could (as far as LLVM knows) alias.
    void preload_arguments() {
        const int rank = k_.rank;
        size_.assign(rank, nullptr);
        for (int d = 0; d < rank; ++d)
            size_[d] = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, arg(kSizes), d), fmt::format("size{}", d));
        base_.assign(k_.buffers.size(), nullptr);
        stride_.assign(k_.buffers.size(), std::vector<Value*>(rank, nullptr));
        for (size_t bi = 0; bi < k_.buffers.size(); ++bi) {
            base_[bi] = b_.CreateLoad(ptr_, b_.CreateConstInBoundsGEP1_64(ptr_, arg(kBuffers), bi), fmt::format("buf{}", bi));
            for (int d = 0; d < rank; ++d)
                if (k_.buffers[bi].layout[d] == kir::StrideKind::Any)
                    stride_[bi][d] = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, arg(kStrides), bi * rank + d));
        }
        fparam_.assign(k_.num_fparams, nullptr);
        iparam_.assign(k_.num_iparams, nullptr);
        auto need_i = [&](int i) {
            if (i < 0 || i >= k_.num_iparams) throw InternalError("llvm codegen: iparam index out of range in " + k_.name);
            if (!iparam_[i]) iparam_[i] = b_.CreateLoad(i32_, b_.CreateConstInBoundsGEP1_64(i32_, arg(kIParams), i));
        };
        dparam_.clear();
        lparam_.clear();
        // A 64-bit parameter: two 32-bit words, low first, read as one (4-byte aligned) value.
        auto wide = [&](std::map<int, Value*>& into, int i, int count, Value* base, Type* t) {
            if (i < 0 || i >= count - 1) throw InternalError("llvm codegen: 64-bit parameter index out of range in " + k_.name);
            if (!into.count(i)) into[i] = b_.CreateAlignedLoad(t, b_.CreateConstInBoundsGEP1_64(i32_, base, i), Align(4));
        };
        for (const auto& in : k_.instrs) {
            if (in.op == Op::ParamF && in.type == CT::F64) {
                wide(dparam_, in.index, k_.num_fparams, arg(kFParams), f64_);
            } else if (in.op == Op::ParamI && in.type == CT::I64) {
                wide(lparam_, in.index, k_.num_iparams, arg(kIParams), i64_);
            } else if (in.op == Op::ParamF) {
                if (in.index < 0 || in.index >= k_.num_fparams)
                    throw InternalError("llvm codegen: fparam index out of range in " + k_.name);
                if (!fparam_[in.index])
                    fparam_[in.index] = b_.CreateLoad(f32_, b_.CreateConstInBoundsGEP1_64(f32_, arg(kFParams), in.index));
            } else if (in.op == Op::ParamI) {
                need_i(in.index);
            } else if (in.op == Op::Gather) {
                need_i(in.aux);
            }
        }
    }

    // Accumulators and (tiled) Point values live in allocas of the entry block: one element, or
    // one per lane. SROA turns the scalar ones into registers.
    void make_slots() {
        const int lanes = tiled_ ? (int)kTile : 1;
        auto make = [&](Type* t) {
            Type* at = tiled_ ? (Type*)ArrayType::get(t, lanes) : t;
            return b_.CreateAlloca(at);
        };
        acc_.assign(k_.accums.size(), {});
        for (size_t ai = 0; ai < k_.accums.size(); ++ai) {
            const kir::Accum& ac = k_.accums[ai];
            acc_[ai].type = keyed(ac) ? (ac.type == CT::F64 ? i64_ : i32_) : type_of(ac.type);
            acc_[ai].value = make(acc_[ai].type);
            if (is_arg(ac.kind)) acc_[ai].pos = make(i32_);
        }
        slot_.assign(k_.instrs.size(), nullptr);
        if (!tiled_) return;
        for (int id : point_values_read_later()) slot_[id] = make(type_of(k_.instrs[id].type));
    }

    // Values of Point blocks that a later block reads (as an operand, accumulated or stored).
    std::vector<int> point_values_read_later() const {
        std::vector<int> home(k_.instrs.size(), -1);  // block defining each value
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
            for (int id : k_.blocks[bi].instrs) home[id] = (int)bi;
        std::vector<bool> read(k_.instrs.size(), false);
        auto note = [&](int id, size_t reader) {
            if (id >= 0 && home[id] >= 0 && home[id] < (int)reader && !k_.blocks[home[id]].loop) read[id] = true;
        };
        for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
            const kir::Block& blk = k_.blocks[bi];
            for (int id : blk.instrs)
                for (int a : k_.instrs[id].a) note(a, bi);
            for (int ai : blk.accums) note(k_.accums[ai].value, bi);
            for (const auto& st : blk.stores) note(st.value, bi);
        }
        std::vector<int> out;
        for (size_t id = 0; id < read.size(); ++id)
            if (read[id]) out.push_back((int)id);
        return out;
    }

    Value* lane_ptr(AllocaInst* a, Type* t) {
        if (!tiled_) return a;
        return b_.CreateInBoundsGEP(ArrayType::get(t, kTile), a, {i64c(0), lane_});
    }

    // ---- loops
    // A counted loop lo, lo+step, ... < hi with an i64 induction variable.
    void for_range(Value* lo, Value* hi, int64_t step, const Twine& name, function_ref<void(Value*)> body) {
        BasicBlock* pre = b_.GetInsertBlock();
        BasicBlock* head = BasicBlock::Create(ctx_, name + ".head", fn_);
        BasicBlock* loop = BasicBlock::Create(ctx_, name + ".body", fn_);
        BasicBlock* exit = BasicBlock::Create(ctx_, name + ".exit", fn_);
        b_.CreateBr(head);
        b_.SetInsertPoint(head);
        PHINode* iv = b_.CreatePHI(i64_, 2, name);
        iv->addIncoming(lo, pre);
        b_.CreateCondBr(b_.CreateICmpSLT(iv, hi), loop, exit);
        b_.SetInsertPoint(loop);
        body(iv);
        iv->addIncoming(b_.CreateAdd(iv, i64c(step), name + ".next", true, true), b_.GetInsertBlock());
        b_.CreateBr(head);
        b_.SetInsertPoint(exit);
    }

    // Runs `body` once per lane of the current tile (tiled), or once. Values never outlive it in
    // tiled mode: Point values cross blocks through their slots.
    void for_lanes(function_ref<void()> body) {
        if (!tiled_) {
            body();
            return;
        }
        for_range(i64c(0), lanes_, 1, "lane", [&](Value* t) {
            lane_ = t;
            std::fill(val_.begin(), val_.end(), nullptr);
            body();
        });
        lane_ = nullptr;
        std::fill(val_.begin(), val_.end(), nullptr);
    }

    // P dims outer (the split dim outermost), then the blocks.
    void p_nest(size_t i, Value* begin, Value* end) {
        if (i == pdims_.size()) {
            run_blocks(0);
            return;
        }
        const int d = pdims_[i];
        Value* lo = i == 0 ? begin : i64c(0);
        Value* hi = i == 0 ? end : size_[d];
        const bool tile_dim = tiled_ && i + 1 == pdims_.size();
        for_range(lo, hi, tile_dim ? kTile : 1, fmt::format("p{}", d), [&](Value* iv) {
            coord_[d] = iv;
            if (tile_dim) {
                Value* left = b_.CreateSub(hi, iv);
                lanes_ = b_.CreateSelect(b_.CreateICmpSLT(left, i64c(kTile)), left, i64c(kTile), "lanes");
            }
            p_nest(i + 1, begin, end);
        });
    }

    // R dims nested in order, the last innermost. R dim 0 covers [lo0, hi0) when given.
    void r_nest(size_t i, Value* lo0, Value* hi0, function_ref<void()> body) {
        if (i == rdims_.size()) {
            body();
            return;
        }
        const int d = rdims_[i];
        Value* lo = i == 0 && lo0 ? lo0 : i64c(0);
        Value* hi = i == 0 && hi0 ? hi0 : size_[d];
        for_range(lo, hi, 1, fmt::format("r{}", d), [&](Value* iv) {
            coord_[d] = iv;
            r_nest(i + 1, lo0, hi0, body);
        });
        coord_[d] = i64c(0);
    }

    // ---- entry bodies
    void body_run() {
        if (!pdims_.empty()) {
            p_nest(0, arg(kArg5), arg(kArg6));
            return;
        }
        BasicBlock* once = BasicBlock::Create(ctx_, "once", fn_);
        BasicBlock* done = BasicBlock::Create(ctx_, "done", fn_);
        b_.CreateCondBr(b_.CreateICmpSLT(arg(kArg5), arg(kArg6)), once, done);
        b_.SetInsertPoint(once);
        run_blocks(0);
        b_.CreateBr(done);
        b_.SetInsertPoint(done);
    }

    const kir::Block* chunked_block() const {
        return !k_.blocks.empty() && k_.blocks[0].loop ? &k_.blocks[0] : nullptr;
    }

    void body_partial() {
        const kir::Block* blk = chunked_block();
        if (!blk) return;
        emit_loop_block(*blk, arg(kArg5), arg(kArg6));
        Value* out = arg(kArg7);
        for (int ai : blk->accums) {
            Value* rec = b_.CreateConstInBoundsGEP1_64(i8_, out, kAccStateBytes * ai);
            b_.CreateStore(acc_value(ai), rec);
            Value* pos = is_arg(k_.accums[ai].kind) ? acc_pos(ai) : i32c(0);
            b_.CreateStore(pos, b_.CreateConstInBoundsGEP1_64(i8_, rec, kAccStatePosition));
        }
    }

    void body_final() {
        const kir::Block* blk = chunked_block();
        if (blk) {
            for (int ai : blk->accums) init_acc(ai);
            const int64_t record = (int64_t)(kAccStateBytes * k_.accums.size());
            for_range(i64c(0), arg(kArg6), 1, "chunk", [&](Value* c) {
                Value* rec = b_.CreateInBoundsGEP(i8_, arg(kArg5), b_.CreateMul(c, i64c(record)));
                for (int ai : blk->accums) {
                    Value* at = b_.CreateConstInBoundsGEP1_64(i8_, rec, kAccStateBytes * ai);
                    Value* v = b_.CreateLoad(type_of(k_.accums[ai].type), at);
                    Value* pos = b_.CreateLoad(i32_, b_.CreateConstInBoundsGEP1_64(i8_, at, kAccStatePosition));
                    // Chunk order and strict comparisons keep first-occurrence semantics.
                    update_acc(ai, v, pos, false);
                }
            });
        }
        run_blocks(blk ? 1 : 0);
    }

    // ---- blocks
    void run_blocks(size_t first) {
        for (size_t i = first; i < k_.blocks.size(); ++i) {
            const kir::Block& blk = k_.blocks[i];
            if (blk.loop) emit_loop_block(blk, nullptr, nullptr);
            else emit_point_block(blk);
        }
    }

    void emit_loop_block(const kir::Block& blk, Value* r0_lo, Value* r0_hi) {
        for_lanes([&] {
            for (int ai : blk.accums) init_acc(ai);
        });
        const bool needs_pos = std::any_of(blk.accums.begin(), blk.accums.end(),
                                           [&](int ai) { return is_arg(k_.accums[ai].kind); });
        r_nest(0, r0_lo, r0_hi, [&] {
            for_lanes([&] {
                eval_block(blk);
                Value* pos = needs_pos ? r_position() : nullptr;
                for (int ai : blk.accums) update_acc(ai, operand(k_.accums[ai].value), pos, true);
                emit_stores(blk);
            });
        });
        for (int id : blk.instrs) val_[id] = nullptr;  // Loop values are local to their block
    }

    void emit_point_block(const kir::Block& blk) {
        for (int d : rdims_) coord_[d] = i64c(0);
        for_lanes([&] {
            eval_block(blk);
            if (tiled_)
                for (int id : blk.instrs)
                    if (slot_[id]) b_.CreateStore(val_[id], lane_ptr(slot_[id], type_of(k_.instrs[id].type)));
            emit_stores(blk);
        });
    }

    void eval_block(const kir::Block& blk) {
        for (int id : blk.instrs) val_[id] = eval(k_.instrs[id], id);
    }

    void emit_stores(const kir::Block& blk) {
        for (const auto& st : blk.stores) store(st.buffer, operand(st.value));
    }

    Value* operand(int id) {
        if (id < 0) throw InternalError("llvm codegen: missing operand in " + k_.name);
        if (val_[id]) return val_[id];
        if (tiled_ && slot_[id]) {
            Type* t = type_of(k_.instrs[id].type);
            return val_[id] = b_.CreateLoad(t, lane_ptr(slot_[id], t));
        }
        throw InternalError("llvm codegen: value %" + std::to_string(id) + " used where it is not visible in " +
                            k_.name + "\n" + kir::to_string(k_));
    }

    // ---- accumulators
    // Float Max/Min reduce i32 keys ordered like the floats, NaN mapped to the extreme key: an
    // integer max/min reduction, which LLVM vectorises, that propagates NaN. The bit mapping is
    // its own inverse. (Unlike the sequential rule, -0 and +0 are ordered: max(-0, +0) is +0.)
    static bool keyed(const kir::Accum& ac) {
        return is_float(ac.type) && (ac.kind == AccKind::Max || ac.kind == AccKind::Min);
    }
    // Keys of the float's width (i32 for f32, i64 for f64).
    Value* to_key(Value* f) {
        const bool wide = f->getType()->isDoubleTy();
        Value* bits = b_.CreateBitCast(f, wide ? i64_ : i32_);
        return wide ? b_.CreateXor(bits, b_.CreateAnd(b_.CreateAShr(bits, 63), i64c(INT64_MAX)))
                    : b_.CreateXor(bits, b_.CreateAnd(b_.CreateAShr(bits, 31), i32c(0x7fffffff)));
    }
    Value* nan_key(AccKind kind, CT t) {
        if (t == CT::F64) return i64c(kind == AccKind::Max ? INT64_MAX : INT64_MIN);
        return i32c(kind == AccKind::Max ? INT32_MAX : INT32_MIN);
    }
    Value* from_key(Value* key, AccKind kind, CT t) {
        Type* ft = type_of(t);
        Value* f = b_.CreateBitCast(to_key(b_.CreateBitCast(key, ft)), ft);
        return b_.CreateSelect(b_.CreateICmpEQ(key, nan_key(kind, t)), fc(t, std::numeric_limits<double>::quiet_NaN()), f);
    }

    void init_acc(int ai) {
        const kir::Accum& ac = k_.accums[ai];
        const AccSlot& s = acc_[ai];
        const bool f = is_float(ac.type);
        const CT t = ac.type;
        const double inf = std::numeric_limits<double>::infinity();
        const int64_t lo = t == CT::I64 ? INT64_MIN : INT32_MIN, hi = t == CT::I64 ? INT64_MAX : INT32_MAX;
        Value* init = nullptr;
        switch (ac.kind) {
        case AccKind::Sum: init = f ? (Value*)fc(t, 0.0) : ic(t, 0); break;
        case AccKind::Prod: init = f ? (Value*)fc(t, 1.0) : ic(t, 1); break;
        case AccKind::Max: case AccKind::ArgMax: init = f ? (Value*)fc(t, -inf) : ic(t, lo); break;
        case AccKind::Min: case AccKind::ArgMin: init = f ? (Value*)fc(t, inf) : ic(t, hi); break;
        }
        if (keyed(ac)) init = to_key(init);
        b_.CreateStore(init, lane_ptr(s.value, s.type));
        if (s.pos) b_.CreateStore(i32c(0), lane_ptr(s.pos, i32_));
    }

    void update_acc(int ai, Value* v, Value* pos, bool reassociate) {
        const kir::Accum& ac = k_.accums[ai];
        const AccSlot& s = acc_[ai];
        const bool f = is_float(ac.type);
        Value* at = lane_ptr(s.value, s.type);
        Value* cur = b_.CreateLoad(s.type, at);
        Value* next = nullptr;
        switch (ac.kind) {
        case AccKind::Sum:
        case AccKind::Prod: {
            const bool add = ac.kind == AccKind::Sum;
            if (!f) {
                next = add ? b_.CreateAdd(cur, v) : b_.CreateMul(cur, v);
                break;
            }
            next = add ? b_.CreateFAdd(cur, v) : b_.CreateFMul(cur, v);
            if (auto* inst = dyn_cast<Instruction>(next); inst && reassociate) {
                FastMathFlags fmf;
                fmf.setAllowReassoc();
                inst->setFastMathFlags(fmf);
            }
            break;
        }
        case AccKind::Max:
        case AccKind::Min: {
            Value* x = f ? b_.CreateSelect(is_nan(v), nan_key(ac.kind, ac.type), to_key(v)) : v;
            next = b_.CreateBinaryIntrinsic(ac.kind == AccKind::Max ? Intrinsic::smax : Intrinsic::smin, cur, x);
            break;
        }
        case AccKind::ArgMax:
        case AccKind::ArgMin: {
            const bool mx = is_max(ac.kind);
            Value* better;
            if (f) {
                Value* cmp = mx ? b_.CreateFCmpOGT(v, cur) : b_.CreateFCmpOLT(v, cur);
                better = b_.CreateAnd(b_.CreateFCmpORD(cur, cur), b_.CreateOr(is_nan(v), cmp));
            } else {
                better = mx ? b_.CreateICmpSGT(v, cur) : b_.CreateICmpSLT(v, cur);
            }
            next = b_.CreateSelect(better, v, cur);
            Value* pat = lane_ptr(s.pos, i32_);
            b_.CreateStore(b_.CreateSelect(better, pos, b_.CreateLoad(i32_, pat)), pat);
            break;
        }
        }
        b_.CreateStore(next, at);
    }

    Value* acc_value(int ai) {
        const kir::Accum& ac = k_.accums[ai];
        const AccSlot& s = acc_[ai];
        Value* v = b_.CreateLoad(s.type, lane_ptr(s.value, s.type));
        return keyed(ac) ? from_key(v, ac.kind, ac.type) : v;
    }
    Value* acc_pos(int ai) { return b_.CreateLoad(i32_, lane_ptr(acc_[ai].pos, i32_)); }

    // Row-major index of the current point over the R dims.
    Value* r_position() {
        Value* pos = nullptr;
        for (int d : rdims_) pos = pos ? b_.CreateAdd(b_.CreateMul(pos, size_[d]), coord_[d]) : coord_[d];
        return pos ? b_.CreateTrunc(pos, i32_) : (Value*)i32c(0);
    }

    // ---- memory
    Value* coord_at(int d) {
        if (tiled_ && lane_ && d == pdims_.back()) return b_.CreateAdd(coord_[d], lane_, "", false, true);
        return coord_[d];
    }

    static Type* storage_type(LLVMContext& c, DType t) {
        switch (t) {
        case DType::Float32: return Type::getFloatTy(c);
        case DType::Float16: case DType::BFloat16: return Type::getInt16Ty(c);
        case DType::Int32: return Type::getInt32Ty(c);
        case DType::Int8: case DType::UInt8: case DType::Bool: return Type::getInt8Ty(c);
        case DType::Float64: return Type::getDoubleTy(c);
        case DType::Int64: case DType::UInt64: return Type::getInt64Ty(c);
        case DType::Int16: case DType::UInt16: return Type::getInt16Ty(c);
        case DType::UInt32: return Type::getInt32Ty(c);
        }
        return Type::getInt8Ty(c);
    }

    Value* address(int buf, Value* extra) {
        const kir::Buffer& bd = k_.buffers[buf];
        Value* off = extra;
        for (int d = 0; d < k_.rank; ++d) {
            Value* term;
            switch (bd.layout[d]) {
            case kir::StrideKind::Zero: continue;
            case kir::StrideKind::One: term = coord_at(d); break;
            default: term = b_.CreateMul(coord_at(d), stride_[buf][d], "", false, true); break;
            }
            off = off ? b_.CreateAdd(off, term, "", false, true) : term;
        }
        if (!off) return base_[buf];
        return b_.CreateInBoundsGEP(storage_type(ctx_, bd.dtype), base_[buf], off);
    }

    // kir::Op::Convert's rules: integer to float rounds to nearest, float to integer truncates
    // (saturating, NaN -> 0), floats widen or round to nearest, integers sign-extend or wrap.
    Value* convert(Value* v, CT from, CT to) {
        if (from == to) return v;
        Type* t = type_of(to);
        if (is_float(to)) {
            if (!is_float(from)) return b_.CreateSIToFP(v, t);
            return to == CT::F64 ? b_.CreateFPExt(v, t) : b_.CreateFPTrunc(v, t);
        }
        if (is_float(from)) return b_.CreateIntrinsic(Intrinsic::fptosi_sat, {t, type_of(from)}, {v});
        return to == CT::I64 ? b_.CreateSExt(v, t) : b_.CreateTrunc(v, t);
    }

    Value* load(int buf, CT want, Value* extra) {
        const DType t = k_.buffers[buf].dtype;
        Value* p = address(buf, extra);
        Type* st = storage_type(ctx_, t);
        Value* raw = b_.CreateAlignedLoad(st, p, Align(dtype_size(t)));
        Value* v = nullptr;
        switch (t) {
        case DType::Float32: case DType::Int32: v = raw; break;
        case DType::Float16: v = f16_to_f32(raw); break;
        case DType::BFloat16: v = b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(raw, i32_), 16), f32_); break;
        case DType::Int8: v = b_.CreateSExt(raw, i32_); break;
        case DType::UInt8: v = b_.CreateZExt(raw, i32_); break;
        case DType::Bool: v = bool_i32(b_.CreateICmpNE(raw, ConstantInt::get(i8_, 0))); break;
        case DType::Float64: case DType::Int64: case DType::UInt64: v = raw; break;
        case DType::Int16: v = b_.CreateSExt(raw, i32_); break;
        case DType::UInt16: v = b_.CreateZExt(raw, i32_); break;
        case DType::UInt32: v = b_.CreateZExt(raw, i64_); break;
        }
        return convert(v, compute_type(t), want);
    }

    void store(int buf, Value* v) {
        const DType t = k_.buffers[buf].dtype;
        v = convert(v, ct_of(v->getType()), compute_type(t));
        Value* raw = nullptr;
        switch (t) {
        case DType::Float32: case DType::Int32: raw = v; break;
        case DType::Float16: raw = f32_to_f16(v); break;
        case DType::BFloat16: raw = f32_to_bf16(v); break;
        case DType::Int8: case DType::UInt8: raw = b_.CreateTrunc(v, i8_); break;
        case DType::Bool: raw = b_.CreateZExt(b_.CreateICmpNE(v, i32c(0)), i8_); break;
        case DType::Float64: case DType::Int64: case DType::UInt64: raw = v; break;
        case DType::Int16: case DType::UInt16: raw = b_.CreateTrunc(v, i16_); break;
        case DType::UInt32: raw = b_.CreateTrunc(v, i32_); break;
        }
        b_.CreateAlignedStore(raw, address(buf, nullptr), Align(dtype_size(t)));
    }

    // ---- 16-bit floats, in integer arithmetic (branch-free, so it vectorises)
    Value* f16_to_f32(Value* h16) {
        Value* h = b_.CreateZExt(h16, i32_);
        Value* sign = b_.CreateShl(b_.CreateAnd(h, i32c(0x8000)), 16);
        Value* em = b_.CreateAnd(h, i32c(0x7fff));
        Value* shifted = b_.CreateShl(em, 13);
        Value* normal = b_.CreateAdd(shifted, i32c(0x38000000));  // rebias the exponent: 127 - 15
        Value* inf_nan = b_.CreateOr(shifted, i32c(0x7f800000));  // payload kept
        // Subnormal: em * 2^-24, exact in float.
        Value* sub = b_.CreateBitCast(b_.CreateFMul(b_.CreateUIToFP(em, f32_), f32c(0x1p-24f)), i32_);
        Value* bits = b_.CreateSelect(b_.CreateICmpUGE(em, i32c(0x7c00)), inf_nan,
                                      b_.CreateSelect(b_.CreateICmpULT(em, i32c(0x400)), sub, normal));
        return b_.CreateBitCast(b_.CreateOr(bits, sign), f32_);
    }

    // Round to nearest even; NaN stays NaN (quiet, payload's top bits kept), overflow gives inf,
    // results below the normal range become correctly rounded subnormals or zero.
    Value* f32_to_f16(Value* f) {
        Value* u = b_.CreateBitCast(f, i32_);
        Value* sign = b_.CreateAnd(b_.CreateLShr(u, 16), i32c(0x8000));
        Value* a = b_.CreateAnd(u, i32c(0x7fffffff));
        Value* nan = b_.CreateOr(i32c(0x7e00), b_.CreateAnd(b_.CreateLShr(a, 13), i32c(0x3ff)));
        // Normal: drop 13 mantissa bits, adding 0xfff plus the kept lsb rounds half to even.
        Value* lsb = b_.CreateAnd(b_.CreateLShr(a, 13), i32c(1));
        Value* normal = b_.CreateLShr(b_.CreateAdd(b_.CreateSub(a, i32c(0x38000000)), b_.CreateAdd(lsb, i32c(0xfff))), 13);
        // Subnormal: the full significand shifted right by 126 - exponent (capped at 25, where
        // every significand rounds to 0), rounded the same way.
        Value* e = b_.CreateLShr(a, 23);
        Value* m = b_.CreateOr(b_.CreateAnd(a, i32c(0x7fffff)), i32c(0x800000));
        Value* shift = b_.CreateBinaryIntrinsic(Intrinsic::umin, b_.CreateSub(i32c(126), e), i32c(25));
        Value* half_m1 = b_.CreateSub(b_.CreateShl(i32c(1), b_.CreateSub(shift, i32c(1))), i32c(1));
        Value* slsb = b_.CreateAnd(b_.CreateLShr(m, shift), i32c(1));
        Value* sub = b_.CreateLShr(b_.CreateAdd(m, b_.CreateAdd(half_m1, slsb)), shift);
        Value* r = b_.CreateSelect(
            b_.CreateICmpUGT(a, i32c(0x7f800000)), nan,
            b_.CreateSelect(b_.CreateICmpUGE(a, i32c(0x477ff000)), i32c(0x7c00),
                            b_.CreateSelect(b_.CreateICmpUGE(a, i32c(0x38800000)), normal, sub)));
        return b_.CreateTrunc(b_.CreateOr(r, sign), i16_);
    }

    Value* f32_to_bf16(Value* f) {
        Value* u = b_.CreateBitCast(f, i32_);
        Value* hi = b_.CreateLShr(u, 16);
        Value* nan = b_.CreateOr(hi, i32c(0x40));
        Value* rounded = b_.CreateLShr(b_.CreateAdd(u, b_.CreateAdd(b_.CreateAnd(hi, i32c(1)), i32c(0x7fff))), 16);
        Value* is_nan_bits = b_.CreateICmpUGT(b_.CreateAnd(u, i32c(0x7fffffff)), i32c(0x7f800000));
        return b_.CreateTrunc(b_.CreateSelect(is_nan_bits, nan, rounded), i16_);
    }

    // ---- instructions
    // tanh in IR rather than a call to libm's tanhf, so that loops using it vectorise (exp
    // vectorises through the vector math library; a tanhf call keeps the whole loop scalar).
    // Cephes' tanhf: an odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above; a few
    // ulp either way. NaN goes through exp and stays NaN; large |x| gives exactly +-1.
    Value* tanh_f32(Value* x) {
        Value* ax = b_.CreateUnaryIntrinsic(Intrinsic::fabs, x);
        Value* z = b_.CreateFMul(x, x);
        Value* p = f32c(-5.70498872745e-3f);
        for (float c : {2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f, -3.33332819422e-1f})
            p = b_.CreateFAdd(b_.CreateFMul(p, z), f32c(c));
        Value* small = b_.CreateFAdd(b_.CreateFMul(b_.CreateFMul(p, z), x), x);
        Value* e = b_.CreateUnaryIntrinsic(Intrinsic::exp, b_.CreateFMul(ax, f32c(2)));
        Value* big = b_.CreateFSub(f32c(1), b_.CreateFDiv(f32c(2), b_.CreateFAdd(e, f32c(1))));
        big = b_.CreateBinaryIntrinsic(Intrinsic::copysign, big, x);
        return b_.CreateSelect(b_.CreateFCmpOLT(ax, f32c(0.625f)), small, big);
    }

    // `float name(float)` of the host's C library (the JIT links it from the process), treated
    // as pure, as clang does under -fno-math-errno: no kernel reads errno, and a pure call may
    // be vectorised through the vector math library.
    // A call of the C library's float function `name` of one or two floats (no errno: pure).
    // A double argument calls the double function (the name without its final 'f').
    Value* c_call(const char* name, Value* x, Value* y = nullptr) {
        Type* t = x->getType();
        std::string fname = name;
        if (t->isDoubleTy() && !fname.empty() && fname.back() == 'f') fname.pop_back();
        std::vector<Type*> params(y ? 2 : 1, t);
        FunctionCallee f = m_.getOrInsertFunction(fname, FunctionType::get(t, params, false));
        if (auto* fn = dyn_cast<Function>(f.getCallee())) {
            fn->setDoesNotThrow();
            fn->setDoesNotAccessMemory();
        }
        return y ? b_.CreateCall(f, {x, y}) : b_.CreateCall(f, {x});
    }

    Value* eval(const kir::Instr& in, int id) {
        const CT t = in.type;
        const bool F = is_float(t);
        auto A = [&](int i) { return operand(in.a[i]); };
        const CT xt = in.a[0] >= 0 ? k_.instrs[in.a[0]].type : t;   // the first operand's type
        auto operand_is_float = [&] { return is_float(xt); };
        switch (in.op) {
        case Op::ConstF: return fc(t, in.fimm);
        case Op::ConstI: return ic(t, in.iimm);
        case Op::ParamF: return t == CT::F64 ? dparam_.at(in.index) : fparam_.at(in.index);
        case Op::ParamI: return t == CT::I64 ? lparam_.at(in.index) : iparam_.at(in.index);
        case Op::Load: return load(in.index, in.type, nullptr);
        case Op::Gather: {
            Value* along = b_.CreateMul(b_.CreateSExt(A(0), i64_), b_.CreateSExt(iparam_.at(in.aux), i64_));
            return load(in.index, in.type, along);
        }
        case Op::Coord: return b_.CreateTrunc(coord_at(in.index), i32_);
        case Op::LinearId: {
            Value* lin = i64c(0);
            for (int d = 0; d < k_.rank; ++d) lin = b_.CreateAdd(b_.CreateMul(lin, size_[d]), coord_at(d));
            return b_.CreateTrunc(lin, i32_);
        }
        case Op::AccResult: return is_arg(k_.accums[in.index].kind) ? acc_pos(in.index) : acc_value(in.index);
        case Op::Neg: return F ? b_.CreateFNeg(A(0)) : b_.CreateSub(ic(t, 0), A(0));
        case Op::Abs:
            return F ? b_.CreateUnaryIntrinsic(Intrinsic::fabs, A(0))
                     : b_.CreateBinaryIntrinsic(Intrinsic::abs, A(0), b_.getFalse());
        case Op::Sqrt: return b_.CreateUnaryIntrinsic(Intrinsic::sqrt, A(0));
        case Op::Exp: return b_.CreateUnaryIntrinsic(Intrinsic::exp, A(0));
        case Op::Exp2: return b_.CreateUnaryIntrinsic(Intrinsic::exp2, A(0));
        case Op::Log: return b_.CreateUnaryIntrinsic(Intrinsic::log, A(0));
        case Op::Log2: return b_.CreateUnaryIntrinsic(Intrinsic::log2, A(0));
        case Op::Tanh: return t == CT::F64 ? c_call("tanhf", A(0)) : tanh_f32(A(0));
#define KILN_MATH(K, name, c_function, host) \
        case Op::K: return c_call(#c_function, A(0));
#define KILN_MATH2(K, name, c_function, host) \
        case Op::K: return c_call(#c_function, A(0), A(1));
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
        case Op::Rint: return b_.CreateUnaryIntrinsic(Intrinsic::roundeven, A(0));
        case Op::Sgn: {
            Value* x = A(0);
            if (!F)
                return b_.CreateSub(b_.CreateZExt(b_.CreateICmpSGT(x, ic(t, 0)), type_of(t)),
                                    b_.CreateZExt(b_.CreateICmpSLT(x, ic(t, 0)), type_of(t)));
            Value* s = b_.CreateSelect(b_.CreateFCmpOGT(x, fc(t, 0)), fc(t, 1),
                                       b_.CreateSelect(b_.CreateFCmpOLT(x, fc(t, 0)), fc(t, -1), fc(t, 0)));
            return b_.CreateSelect(is_nan(x), x, s);
        }
        case Op::Finite:
            return bool_i32(b_.CreateFCmpOLT(b_.CreateUnaryIntrinsic(Intrinsic::fabs, A(0)),
                                             fc(xt, std::numeric_limits<double>::infinity())));
        case Op::ToF32: case Op::ToI32: case Op::Convert: return convert(A(0), xt, t);
        case Op::WrapI8: return b_.CreateSExt(b_.CreateTrunc(A(0), i8_), i32_);
        case Op::WrapU8: return b_.CreateAnd(A(0), i32c(0xff));
        case Op::WrapI16: return b_.CreateSExt(b_.CreateTrunc(A(0), i16_), i32_);
        case Op::WrapU16: return b_.CreateAnd(A(0), i32c(0xffff));
        case Op::WrapU32: return b_.CreateAnd(A(0), i64c(0xffffffffLL));
        case Op::AsI64: return b_.CreateBitCast(A(0), i64_);
        case Op::AsF64: return b_.CreateBitCast(A(0), f64_);
        case Op::ToBool:
            return bool_i32(operand_is_float() ? b_.CreateFCmpUNE(A(0), fc(xt, 0)) : b_.CreateICmpNE(A(0), ic(xt, 0)));
        case Op::Add: return F ? b_.CreateFAdd(A(0), A(1)) : b_.CreateAdd(A(0), A(1));
        case Op::Sub: return F ? b_.CreateFSub(A(0), A(1)) : b_.CreateSub(A(0), A(1));
        case Op::Mul: return F ? b_.CreateFMul(A(0), A(1)) : b_.CreateMul(A(0), A(1));
        case Op::Div: return b_.CreateFDiv(A(0), A(1));
        case Op::Pow: return b_.CreateBinaryIntrinsic(Intrinsic::pow, A(0), A(1));
        case Op::Maximum:
        case Op::Minimum: {
            Value *x = A(0), *y = A(1);
            const bool mx = in.op == Op::Maximum;
            if (!F) return b_.CreateBinaryIntrinsic(mx ? Intrinsic::smax : Intrinsic::smin, x, y);
            // NumPy's maximum/minimum: a NaN on either side wins.
            Value* cmp = mx ? b_.CreateFCmpOGT(x, y) : b_.CreateFCmpOLT(x, y);
            return b_.CreateSelect(b_.CreateOr(cmp, is_nan(x)), x, y);
        }
        case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
            return bool_i32(compare(in.op, operand_is_float(), A(0), A(1)));
        case Op::And: return b_.CreateAnd(A(0), A(1));
        case Op::Or: return b_.CreateOr(A(0), A(1));
        case Op::Xor: return b_.CreateXor(A(0), A(1));
        case Op::Shl: return b_.CreateShl(A(0), b_.CreateAnd(A(1), ic(t, t == CT::I64 ? 63 : 31)));
        case Op::Shr: return b_.CreateLShr(A(0), b_.CreateAnd(A(1), ic(t, t == CT::I64 ? 63 : 31)));
        case Op::MulHi: {
            Value* p = b_.CreateMul(b_.CreateZExt(A(0), i64_), b_.CreateZExt(A(1), i64_));
            return b_.CreateTrunc(b_.CreateLShr(p, 32), i32_);
        }
        case Op::Select: return b_.CreateSelect(b_.CreateICmpNE(A(0), i32c(0)), A(1), A(2));
        case Op::AsI32: return b_.CreateBitCast(A(0), i32_);
        case Op::AsF32: return b_.CreateBitCast(A(0), f32_);
        case Op::Floor: return b_.CreateUnaryIntrinsic(Intrinsic::floor, A(0));
        case Op::Fmod: return b_.CreateFRem(A(0), A(1));   // LLVM's frem is C's fmod
        case Op::NextAfter: return c_call("nextafterf", A(0), A(1));
        case Op::IDiv: return b_.CreateSDiv(A(0), A(1));
        case Op::IRem: return b_.CreateSRem(A(0), A(1));
        }
        throw InternalError("llvm codegen: unknown op in instruction %" + std::to_string(id) + " of " + k_.name);
    }

    Value* compare(Op op, bool f, Value* x, Value* y) {
        switch (op) {
        case Op::Eq: return f ? b_.CreateFCmpOEQ(x, y) : b_.CreateICmpEQ(x, y);
        case Op::Ne: return f ? b_.CreateFCmpUNE(x, y) : b_.CreateICmpNE(x, y);
        case Op::Lt: return f ? b_.CreateFCmpOLT(x, y) : b_.CreateICmpSLT(x, y);
        case Op::Le: return f ? b_.CreateFCmpOLE(x, y) : b_.CreateICmpSLE(x, y);
        case Op::Gt: return f ? b_.CreateFCmpOGT(x, y) : b_.CreateICmpSGT(x, y);
        default: return f ? b_.CreateFCmpOGE(x, y) : b_.CreateICmpSGE(x, y);
        }
    }
};

} // namespace

std::unique_ptr<llvm::Module> emit_llvm(const kir::Kernel& k, llvm::LLVMContext& ctx) {
    check_kernel(k);
    auto m = std::make_unique<Module>(k.name, ctx);
    if (k.full_reduce) {
        Emitter(k, *m).emit(Entry::Partial, partial_entry_name(k.name));
        Emitter(k, *m).emit(Entry::Final, final_entry_name(k.name));
    } else {
        Emitter(k, *m).emit(Entry::Run, k.name);
    }
    std::string err;
    raw_string_ostream os(err);
    if (verifyModule(*m, &os))
        throw InternalError("llvm codegen: generated IR for '" + k.name + "' does not verify: " + os.str() + "\n" +
                            module_text(*m));
    return m;
}

} // namespace kiln::codegen
