//! Python values on rankmesh's object plane, without pickle.
//!
//! A value crosses ranks as data: None, bool, int (any size), float, str,
//! bytes, lists, tuples, dicts of these, and NumPy arrays (dtype by name,
//! shape and bytes). A receiver only ever builds those types, so a peer can
//! never make it run code, which is what unpickling a peer's bytes allows.
//! Anything else is refused on the sender with an error saying why.
//!
//! The format is a tag byte per value, little-endian fixed-width numbers
//! and length-prefixed payloads, written and read in one pass straight
//! from and to Python objects (no tree in between). The decoder checks
//! every length against the bytes left and limits nesting, so bytes from a
//! hostile peer are an error, never a crash or a huge allocation.

use crate::errors::ObjectError;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use std::ptr::addr_of_mut;

/// Nesting allowed, on the sender and on the receiver.
const MAX_DEPTH: usize = 64;

const NONE: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const BIG_INT: u8 = 4;
const FLOAT: u8 = 5;
const STR: u8 = 6;
const BYTES: u8 = 7;
const LIST: u8 = 8;
const TUPLE: u8 = 9;
const DICT: u8 = 10;
const ARRAY: u8 = 11;

/// `obj` as bytes, or an error naming what cannot be sent.
pub fn encode(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    put(&mut out, obj, 0)?;
    Ok(out)
}

/// The value `bytes` (from a peer) stand for.
pub fn decode<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut r = Reader { bytes, at: 0 };
    let v = r.value(py, 0)?;
    if r.at != bytes.len() {
        return Err(r.bad("bytes after the value"));
    }
    Ok(v)
}

fn put_len(out: &mut Vec<u8>, n: usize) -> PyResult<()> {
    let n = u32::try_from(n)
        .map_err(|_| ObjectError::new_err(format!("a value of {n} items or bytes is too large")))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, tag: u8, b: &[u8]) -> PyResult<()> {
    out.push(tag);
    put_len(out, b.len())?;
    out.extend_from_slice(b);
    Ok(())
}

fn put(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if depth > MAX_DEPTH {
        return Err(ObjectError::new_err(format!(
            "an object nested deeper than {MAX_DEPTH} levels (a list that contains itself?)"
        )));
    }
    match kind(obj) {
        Some(Kind::Float) => {
            let f: f64 = obj.extract()?;
            out.push(FLOAT);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Some(Kind::None) => out.push(NONE),
        Some(Kind::Bool) => out.push(if obj.is_truthy()? { TRUE } else { FALSE }),
        Some(Kind::Int) => match obj.extract::<i64>() {
            Ok(v) => {
                out.push(INT);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Err(_) => {
                let s: String = obj.str()?.extract()?;
                put_bytes(out, BIG_INT, s.as_bytes())?;
            }
        },
        Some(Kind::Str) => put_bytes(out, STR, obj.cast::<PyString>()?.to_str()?.as_bytes())?,
        Some(Kind::Bytes) => put_bytes(out, BYTES, obj.cast::<PyBytes>()?.as_bytes())?,
        Some(Kind::ByteArray) => put_bytes(out, BYTES, &obj.cast::<PyByteArray>()?.to_vec())?,
        Some(Kind::List) => {
            let l = obj.cast::<PyList>()?;
            out.push(LIST);
            put_len(out, l.len())?;
            for v in l.iter() {
                put(out, &v, depth + 1)?;
            }
        }
        Some(Kind::Tuple) => {
            let t = obj.cast::<PyTuple>()?;
            out.push(TUPLE);
            put_len(out, t.len())?;
            for v in t.iter() {
                put(out, &v, depth + 1)?;
            }
        }
        Some(Kind::Dict) => {
            let d = obj.cast::<PyDict>()?;
            out.push(DICT);
            put_len(out, d.len())?;
            for (k, v) in d.iter() {
                put(out, &k, depth + 1)?;
                put(out, &v, depth + 1)?;
            }
        }
        None => return put_other(out, obj, depth),
    }
    Ok(())
}

enum Kind {
    Float,
    None,
    Bool,
    Int,
    Str,
    Bytes,
    ByteArray,
    List,
    Tuple,
    Dict,
}

/// Which built-in `obj` is: by exact type first (one pointer compare
/// each; a config of a few hundred floats encodes in a few microseconds),
/// then subclasses by isinstance.
fn kind(obj: &Bound<'_, PyAny>) -> Option<Kind> {
    // SAFETY: reading an object's type (`addr_of_mut!` of a static is safe).
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let exact = [
        (addr_of_mut!(ffi::PyFloat_Type), Kind::Float),
        (addr_of_mut!(ffi::PyUnicode_Type), Kind::Str),
        (addr_of_mut!(ffi::PyLong_Type), Kind::Int),
        (addr_of_mut!(ffi::PyList_Type), Kind::List),
        (addr_of_mut!(ffi::PyDict_Type), Kind::Dict),
        (addr_of_mut!(ffi::PyBool_Type), Kind::Bool),
        (addr_of_mut!(ffi::PyTuple_Type), Kind::Tuple),
        (addr_of_mut!(ffi::PyBytes_Type), Kind::Bytes),
    ];
    if let Some((_, k)) = exact.into_iter().find(|(t, _)| *t == ty) {
        return Some(k);
    }
    Some(if obj.is_none() {
        Kind::None
    } else if obj.cast::<PyBool>().is_ok() {
        Kind::Bool
    } else if obj.cast::<PyFloat>().is_ok() {
        Kind::Float
    } else if obj.cast::<PyInt>().is_ok() {
        Kind::Int
    } else if obj.cast::<PyString>().is_ok() {
        Kind::Str
    } else if obj.cast::<PyBytes>().is_ok() {
        Kind::Bytes
    } else if obj.cast::<PyByteArray>().is_ok() {
        Kind::ByteArray
    } else if obj.cast::<PyList>().is_ok() {
        Kind::List
    } else if obj.cast::<PyTuple>().is_ok() {
        Kind::Tuple
    } else if obj.cast::<PyDict>().is_ok() {
        Kind::Dict
    } else {
        return None;
    })
}

/// NumPy arrays and scalars; anything else is refused.
fn put_other(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if is_numpy(obj, "ndarray") {
        let dt = obj.getattr("dtype")?;
        let kind: String = dt.getattr("kind")?.extract()?;
        if kind == "O" {
            return Err(refused(obj, Some("a NumPy array of Python objects")));
        }
        // Built-in dtypes by type string (`<f4`); ml_dtypes' by name.
        let dtype: String = if kind == "V" {
            dt.getattr("name")?
        } else {
            dt.getattr("str")?
        }
        .extract()?;
        let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
        let data = obj.call_method1("tobytes", ("C",))?;
        let data = data.cast::<PyBytes>()?;
        out.push(ARRAY);
        put_len(out, dtype.len())?;
        out.extend_from_slice(dtype.as_bytes());
        put_len(out, shape.len())?;
        for d in &shape {
            out.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        let data = data.as_bytes();
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
        return Ok(());
    }
    if is_numpy(obj, "generic") {
        return put(out, &obj.call_method0("item")?, depth);
    }
    Err(refused(obj, None))
}

struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn bad(&self, what: &str) -> PyErr {
        ObjectError::new_err(format!(
            "a peer sent bytes that are not a rankmesh value ({what} at byte {} of {})",
            self.at,
            self.bytes.len()
        ))
    }

    fn take(&mut self, n: usize) -> PyResult<&'b [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| self.bad("a length past the end"))?;
        let b = &self.bytes[self.at..end];
        self.at = end;
        Ok(b)
    }

    fn u8(&mut self) -> PyResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> PyResult<usize> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }

    fn u64(&mut self) -> PyResult<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn text(&mut self) -> PyResult<&'b str> {
        let n = self.u32()?;
        let b = self.take(n)?;
        std::str::from_utf8(b).map_err(|_| self.bad("text that is not UTF-8"))
    }

    /// A count of items, each at least one byte: never more than the bytes left.
    fn count(&mut self) -> PyResult<usize> {
        let n = self.u32()?;
        if n > self.bytes.len() - self.at {
            return Err(self.bad("a count larger than the bytes left"));
        }
        Ok(n)
    }

    fn items<'py>(&mut self, py: Python<'py>, depth: usize) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let n = self.count()?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(py, depth + 1)?);
        }
        Ok(items)
    }

    fn value<'py>(&mut self, py: Python<'py>, depth: usize) -> PyResult<Bound<'py, PyAny>> {
        if depth > MAX_DEPTH {
            return Err(self.bad("nesting deeper than the limit"));
        }
        Ok(match self.u8()? {
            NONE => py.None().into_bound(py),
            FALSE => PyBool::new(py, false).to_owned().into_any(),
            TRUE => PyBool::new(py, true).to_owned().into_any(),
            INT => (self.u64()? as i64).into_pyobject(py)?.into_any(),
            BIG_INT => {
                let s = self.text()?;
                if s.is_empty()
                    || !s
                        .trim_start_matches('-')
                        .bytes()
                        .all(|c| c.is_ascii_digit())
                {
                    return Err(self.bad("an integer that is not decimal digits"));
                }
                py.get_type::<PyInt>().call1((s,))?
            }
            FLOAT => PyFloat::new(py, f64::from_le_bytes(self.take(8)?.try_into().expect("8")))
                .into_any(),
            STR => PyString::new(py, self.text()?).into_any(),
            BYTES => {
                let n = self.u32()?;
                PyBytes::new(py, self.take(n)?).into_any()
            }
            LIST => PyList::new(py, self.items(py, depth)?)?.into_any(),
            TUPLE => PyTuple::new(py, self.items(py, depth)?)?.into_any(),
            DICT => {
                let n = self.count()?;
                let d = PyDict::new(py);
                for _ in 0..n {
                    let k = self.value(py, depth + 1)?;
                    let v = self.value(py, depth + 1)?;
                    d.set_item(k, v).map_err(|e| {
                        ObjectError::new_err(format!(
                            "a peer sent a dict key that cannot be one: {e}"
                        ))
                    })?;
                }
                d.into_any()
            }
            ARRAY => {
                let dtype = self.text()?;
                let ndim = self.count()?;
                let mut shape = Vec::with_capacity(ndim);
                for _ in 0..ndim {
                    shape.push(self.u64()? as usize);
                }
                let n = self.u64()?;
                let data =
                    self.take(usize::try_from(n).map_err(|_| self.bad("an array too large"))?)?;
                let numpy = py.import("numpy")?;
                let dt = numpy.call_method1("dtype", (dtype,)).map_err(|e| {
                    ObjectError::new_err(format!("a peer sent an array of dtype {dtype:?}: {e}"))
                })?;
                if dt.getattr("hasobject")?.extract::<bool>()? {
                    return Err(self.bad("an array of Python objects"));
                }
                let buf = PyByteArray::new(py, data);
                numpy
                    .call_method1("frombuffer", (buf, dt))
                    .and_then(|a| a.call_method1("reshape", (PyTuple::new(py, shape)?,)))
                    .map_err(|e| {
                        ObjectError::new_err(format!(
                            "a peer sent an array whose shape and bytes disagree: {e}"
                        ))
                    })?
            }
            _ => return Err(self.bad("an unknown tag")),
        })
    }
}

fn is_numpy(obj: &Bound<'_, PyAny>, class: &str) -> bool {
    let Ok(numpy) = obj.py().import("numpy") else {
        return false;
    };
    numpy
        .getattr(class)
        .and_then(|c| obj.is_instance(&c))
        .unwrap_or(false)
}

fn refused(obj: &Bound<'_, PyAny>, what: Option<&str>) -> PyErr {
    let ty = obj
        .get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    let what = what.map_or_else(|| format!("a value of type {ty}"), str::to_string);
    PyTypeError::new_err(format!(
        "rankmesh cannot send {what}: objects cross ranks as data (None, bool, int, float, str, bytes, \
         list, tuple, dict and NumPy arrays), never pickled, so that no peer can make this rank run code. \
         Send its fields instead"
    ))
}
