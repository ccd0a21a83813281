//! A serde `Deserializer` adapter that bounds nesting depth. Decoding a
//! recursive type from a peer's bytes recurses once per level; without a
//! bound, a forged payload of a few megabytes overflows the stack (a
//! SIGSEGV, not an error). Every sequence, map, enum, option and newtype
//! counts as one level, like serde_json's recursion limit.

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use std::cell::Cell;
use std::fmt;

/// Deepest nesting a decoded object may have.
pub const MAX_DEPTH: u32 = 128;

/// `de` with nesting bounded by [`MAX_DEPTH`] (levels counted in `depth`).
pub struct Limited<'d, D> {
    de: D,
    depth: &'d Cell<u32>,
}

impl<'d, D> Limited<'d, D> {
    /// Wraps `de`; `depth` starts at 0.
    pub fn new(de: D, depth: &'d Cell<u32>) -> Self {
        Limited { de, depth }
    }
}

struct Wrap<'d, X> {
    inner: X,
    depth: &'d Cell<u32>,
}

fn wrap<X>(inner: X, depth: &Cell<u32>) -> Wrap<'_, X> {
    Wrap { inner, depth }
}

/// Set in the depth counter once the limit was hit (formats such as
/// postcard replace a custom error's text, so the caller looks here).
const EXCEEDED: u32 = 1 << 31;

/// Runs `f` one level deeper, or fails past the limit.
fn deeper<T, E: de::Error>(depth: &Cell<u32>, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    if (depth.get() & !EXCEEDED) >= MAX_DEPTH {
        depth.set(depth.get() | EXCEEDED);
        return Err(E::custom(format!(
            "value nested deeper than {MAX_DEPTH} levels"
        )));
    }
    depth.set(depth.get() + 1);
    let r = f();
    depth.set(depth.get() - 1);
    r
}

macro_rules! forward_deserializer {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            self.de.$method($($arg,)* wrap(visitor, self.depth))
        })*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Limited<'_, D> {
    type Error = D::Error;

    forward_deserializer! {
        deserialize_any(); deserialize_bool(); deserialize_i8(); deserialize_i16();
        deserialize_i32(); deserialize_i64(); deserialize_i128(); deserialize_u8();
        deserialize_u16(); deserialize_u32(); deserialize_u64(); deserialize_u128();
        deserialize_f32(); deserialize_f64(); deserialize_char(); deserialize_str();
        deserialize_string(); deserialize_bytes(); deserialize_byte_buf();
        deserialize_option(); deserialize_unit(); deserialize_seq(); deserialize_map();
        deserialize_identifier(); deserialize_ignored_any();
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {
        $(fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        })*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit! {
        visit_bool(bool); visit_i8(i8); visit_i16(i16); visit_i32(i32); visit_i64(i64);
        visit_i128(i128); visit_u8(u8); visit_u16(u16); visit_u32(u32); visit_u64(u64);
        visit_u128(u128); visit_f32(f32); visit_f64(f64); visit_char(char);
        visit_str(&str); visit_borrowed_str(&'de str); visit_string(String);
        visit_bytes(&[u8]); visit_borrowed_bytes(&'de [u8]); visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<V::Value, D2::Error> {
        let depth = self.depth;
        deeper(depth, || self.inner.visit_some(Limited::new(d, depth)))
    }

    fn visit_newtype_struct<D2: Deserializer<'de>>(self, d: D2) -> Result<V::Value, D2::Error> {
        let depth = self.depth;
        deeper(depth, || {
            self.inner.visit_newtype_struct(Limited::new(d, depth))
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        let depth = self.depth;
        deeper(depth, || self.inner.visit_seq(wrap(seq, depth)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let depth = self.depth;
        deeper(depth, || self.inner.visit_map(wrap(map, depth)))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        let depth = self.depth;
        deeper(depth, || self.inner.visit_enum(wrap(data, depth)))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Wrap<'_, S> {
    type Value = S::Value;

    fn deserialize<D2: Deserializer<'de>>(self, d: D2) -> Result<S::Value, D2::Error> {
        self.inner.deserialize(Limited::new(d, self.depth))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.inner.next_element_seed(wrap(seed, self.depth))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.inner.next_key_seed(wrap(seed, self.depth))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.next_value_seed(wrap(seed, self.depth))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 'd, A: EnumAccess<'de>> EnumAccess<'de> for Wrap<'d, A> {
    type Error = A::Error;
    type Variant = Wrap<'d, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let depth = self.depth;
        let (v, variant) = self.inner.variant_seed(wrap(seed, depth))?;
        Ok((v, wrap(variant, depth)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(wrap(seed, self.depth))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(len, wrap(visitor, self.depth))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(fields, wrap(visitor, self.depth))
    }
}

/// Decodes exactly one `T` from postcard `bytes` with nesting bounded.
pub fn from_postcard<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let depth = Cell::new(0);
    let mut de = postcard::Deserializer::from_bytes(bytes);
    let v = T::deserialize(Limited::new(&mut de, &depth)).map_err(|e| {
        if depth.get() & EXCEEDED != 0 {
            format!("value nested deeper than {MAX_DEPTH} levels")
        } else {
            e.to_string()
        }
    })?;
    match de.finalize() {
        Ok([]) => Ok(v),
        Ok(rest) => Err(format!("{} trailing bytes after the value", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Tree {
        Leaf(u8),
        Node(Box<Tree>),
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Mixed {
        a: Option<Vec<(u8, String)>>,
        b: BTreeMap<String, Tree>,
        c: f64,
    }

    fn nested(levels: usize) -> Tree {
        (0..levels).fold(Tree::Leaf(7), |t, _| Tree::Node(Box::new(t)))
    }

    #[test]
    fn ordinary_values_round_trip() {
        let v = Mixed {
            a: Some(vec![(1, "x".into()), (2, "yz".into())]),
            b: [("k".to_string(), nested(10))].into_iter().collect(),
            c: 0.25,
        };
        let bytes = postcard::to_stdvec(&v).unwrap();
        assert_eq!(from_postcard::<Mixed>(&bytes).unwrap(), v);
    }

    #[test]
    fn depth_up_to_the_limit_decodes_and_beyond_is_an_error() {
        // Each Node is one enum level plus its newtype payload.
        let ok = postcard::to_stdvec(&nested(60)).unwrap();
        assert_eq!(from_postcard::<Tree>(&ok).unwrap(), nested(60));
        // A forged payload: a million `Node` tags (variant 1), far past any
        // stack, must be an error, not a crash.
        let mut forged = vec![1u8; 1_000_000];
        forged.extend([0, 7]);
        let e = from_postcard::<Tree>(&forged).unwrap_err();
        assert_eq!(e, "value nested deeper than 128 levels");
    }

    #[test]
    fn trailing_bytes_are_reported() {
        let mut bytes = postcard::to_stdvec(&5u32).unwrap();
        bytes.push(0);
        assert_eq!(
            from_postcard::<u32>(&bytes).unwrap_err(),
            "1 trailing bytes after the value"
        );
    }
}
