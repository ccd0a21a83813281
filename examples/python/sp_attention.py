"""FastVideo's sequence-parallel attention data movement on rankmesh, CPU arrays.

    mpirun -np 4 python examples/python/sp_attention.py

Each rank holds a slice of the sequence for every head; all_to_all_4D turns
that into the whole sequence for a slice of the heads (where attention
runs), and back. The TP group's all_reduce sums a row-parallel projection;
a config broadcast goes on the object plane (data, never pickle).
"""

import numpy as np

import rankmesh as dist

dist.init_distributed_environment()
world = dist.get_world_size()
tp = 2 if world % 2 == 0 else 1
dist.initialize_model_parallel(tensor_model_parallel_size=tp, sequence_model_parallel_size=world)
rank, sp = dist.get_world_rank(), dist.get_sp_world_size()

config = dist.get_world_group().broadcast_object({"heads": 2 * sp, "head_dim": 8, "seq": 4 * sp} if rank == 0 else None)
B, S, H, D = 1, config["seq"], config["heads"], config["head_dim"]

rng = np.random.default_rng(rank)
q = rng.standard_normal((B, S // sp, H, D), dtype=np.float32)  # this rank's sequence slice

full_seq = dist.sequence_model_parallel_all_to_all_4D(q, scatter_dim=2, gather_dim=1)  # [B, S, H/sp, D]
scores = np.einsum("bshd,bthd->bhst", full_seq, full_seq) / np.sqrt(D)
weights = np.exp(scores - scores.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)
attended = np.einsum("bhst,bthd->bshd", weights, full_seq).astype(np.float32)
back = dist.sequence_model_parallel_all_to_all_4D(attended, scatter_dim=1, gather_dim=2)  # [B, S/sp, H, D]

partial = back.reshape(B * (S // sp), H * D) @ np.eye(H * D, dtype=np.float32)
dist.tensor_model_parallel_all_reduce(partial)  # in place: the row-parallel sum

assert back.shape == q.shape
print(f"rank {rank}: q {q.shape} -> full sequence {full_seq.shape} -> back {back.shape}; "
      f"tp sum checksum {float(partial.sum()):.4f}")
