//! Tensor send/recv: explicit peers, default next/prev, every dtype.

use super::reference::{assert_tensor, input, values};
use rankmesh::Collectives as _;
use rankmesh::{DType, ReduceOp, Runtime};

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let shape = [3, 2];
    for dtype in DType::ALL {
        // Pipeline: 0 -> 1 -> ... -> p-1 with default dst/src.
        if me > 0 {
            let got = g.recv(&shape, dtype, None).unwrap();
            assert_tensor(
                &got,
                dtype,
                &shape,
                &values(me - 1, 6, dtype, ReduceOp::Sum),
                "pipeline recv",
            );
        }
        if me + 1 < p {
            g.send(&input(me, &shape, dtype, ReduceOp::Sum), None)
                .unwrap();
        }
        // The last rank answers the first explicitly.
        if me == p - 1 {
            g.send(&input(me, &shape, dtype, ReduceOp::Sum), Some(0))
                .unwrap();
        } else if me == 0 {
            let got = g.recv(&shape, dtype, Some(p - 1)).unwrap();
            assert_tensor(
                &got,
                dtype,
                &shape,
                &values(p - 1, 6, dtype, ReduceOp::Sum),
                "reply",
            );
        }
    }
    // A 0-element tensor still handshakes.
    if me == 0 {
        g.send(
            &rankmesh::Tensor::zeros([0, 4], DType::F32).unwrap(),
            Some(1),
        )
        .unwrap();
    } else if me == 1 {
        assert_eq!(
            g.recv(&[0, 4], DType::F32, Some(0)).unwrap().shape(),
            &[0, 4]
        );
    }
    g.barrier().unwrap();
}
