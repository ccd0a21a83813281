//! Property tests: shape arithmetic never wraps or panics, and decoding
//! call descriptors and message headers from arbitrary bytes (what a
//! corrupt or hostile peer can send) never panics.

use proptest::prelude::*;
use rankmesh::agree::{agree, agree_peers, Descriptor};
use rankmesh::tensor::checked_numel;
use rankmesh::{op::Op, DType, Tensor};

/// Dims that are usually small but sometimes huge, so products overflow.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..5,
        Just(1usize << 32),
        Just(usize::MAX / 3),
        any::<usize>()
    ]
}

fn exact_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let p = shape
        .iter()
        .try_fold(1u128, |n, d| n.checked_mul(*d as u128))?;
    usize::try_from(p).ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn checked_numel_is_the_exact_product_or_none(shape in prop::collection::vec(dim(), 0..6)) {
        // A zero dim makes the product 0 even when others are huge.
        prop_assert_eq!(checked_numel(&shape), exact_numel(&shape));
    }

    #[test]
    fn from_vec_with_an_overflowing_shape_is_an_error(shape in prop::collection::vec(dim(), 0..6)) {
        let r = Tensor::from_vec(shape.clone(), vec![0f32; 3]);
        match exact_numel(&shape) {
            Some(3) => prop_assert!(r.is_ok()),
            _ => prop_assert!(r.is_err()),
        }
    }

    #[test]
    fn reshape_never_wraps(shape in prop::collection::vec(dim(), 0..6)) {
        let t = Tensor::from_vec([2, 3], vec![0u8; 6]).unwrap();
        let r = t.reshape(shape.clone());
        prop_assert_eq!(r.is_ok(), exact_numel(&shape) == Some(6));
    }

    #[test]
    fn zeros_of_huge_shapes_is_an_error_not_a_panic(
        shape in prop::collection::vec(prop_oneof![Just(1usize << 31), Just(1usize << 40), any::<usize>()], 2..5),
        dt in 0usize..10,
    ) {
        // Every such shape is at least 2^62 elements or overflows outright.
        prop_assert!(Tensor::zeros(shape, DType::ALL[dt]).is_err());
    }

    #[test]
    fn descriptors_from_arbitrary_bytes_never_panic(
        a in prop::collection::vec(any::<u8>(), std::mem::size_of::<Descriptor>()),
        b in prop::collection::vec(any::<u8>(), std::mem::size_of::<Descriptor>()),
        me in 0usize..2,
    ) {
        let da: Descriptor = bytemuck::pod_read_unaligned(&a);
        let db: Descriptor = bytemuck::pod_read_unaligned(&b);
        for d in [&da, &db] {
            let _ = d.describe();
            let _ = d.digest();
            let _ = d.shape();
            let _ = d.dims().count();
            if let Some(op) = d.op() {
                let _ = d.validate(op, 2);
                let _ = op.output_shape(&d.shape(), &d.params, 2);
            }
        }
        let _ = agree(&[da, db], me, &|d: &Descriptor| match d.op() {
            Some(op) => d.validate(op, 2),
            None => Ok(()),
        });
        let _ = agree_peers(&da, &db, 0, 1);
    }

    #[test]
    fn valid_descriptors_with_corrupted_bytes_never_panic(
        shape in prop::collection::vec(0usize..9, 0..5),
        flips in prop::collection::vec((0usize..std::mem::size_of::<Descriptor>(), any::<u8>()), 1..8),
    ) {
        let good = Descriptor::for_tensor(Op::AllGather, DType::F32, &shape, &[0]);
        let mut bytes = bytemuck::bytes_of(&good).to_vec();
        for (i, x) in flips {
            bytes[i] ^= x;
        }
        let bad: Descriptor = bytemuck::pod_read_unaligned(&bytes);
        let check = |d: &Descriptor| d.op().map_or(Ok(()), |op| d.validate(op, 3));
        let _ = agree(&[good, bad, good], 0, &check);
        let _ = agree(&[bad, good, good], 2, &check);
        let _ = bad.describe();
    }
}
