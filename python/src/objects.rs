//! Python values on rankmesh's object plane, without pickle.
//!
//! A value crosses ranks as data: None, bool, int (any size), float, str,
//! bytes, lists, tuples, dicts of these, and NumPy arrays (dtype by name,
//! shape and bytes). A receiver only ever builds those types, so a peer can
//! never make it run code, which is what unpickling a peer's bytes allows.
//! Anything else is refused on the sender with an error saying why.

use crate::errors::ObjectError;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use serde::{Deserialize, Serialize};

/// Nesting allowed on the sender; the receiver's decoder has its own limit.
const MAX_DEPTH: usize = 64;

/// A Python value as data.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int outside i64, in decimal.
    BigInt(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    /// A NumPy array: `numpy.dtype(dtype)` (a type string like `<f4`, or a
    /// name like `bfloat16`), its shape and its C-order bytes.
    Array {
        dtype: String,
        shape: Vec<usize>,
        data: Vec<u8>,
    },
}

impl Value {
    /// `obj` as data, or an error naming what cannot be sent.
    pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
        Value::at_depth(obj, 0)
    }

    fn at_depth(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
        if depth > MAX_DEPTH {
            return Err(ObjectError::new_err(format!(
                "an object nested deeper than {MAX_DEPTH} levels (a list that contains itself?)"
            )));
        }
        let inner = |items: Vec<Bound<'_, PyAny>>| -> PyResult<Vec<Value>> {
            items
                .iter()
                .map(|v| Value::at_depth(v, depth + 1))
                .collect()
        };
        if obj.is_none() {
            return Ok(Value::None);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if obj.is_exact_instance_of::<PyInt>() || obj.cast::<PyInt>().is_ok() {
            return Ok(match obj.extract::<i64>() {
                Ok(v) => Value::Int(v),
                Err(_) => Value::BigInt(obj.str()?.extract()?),
            });
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return Ok(Value::Float(f.value()));
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Value::Str(s.to_str()?.to_owned()));
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Value::Bytes(b.as_bytes().to_vec()));
        }
        if let Ok(b) = obj.cast::<PyByteArray>() {
            return Ok(Value::Bytes(b.to_vec()));
        }
        if let Ok(l) = obj.cast::<PyList>() {
            return Ok(Value::List(inner(l.iter().collect())?));
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            return Ok(Value::Tuple(inner(t.iter().collect())?));
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut pairs = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                pairs.push((
                    Value::at_depth(&k, depth + 1)?,
                    Value::at_depth(&v, depth + 1)?,
                ));
            }
            return Ok(Value::Dict(pairs));
        }
        if is_numpy(obj, "ndarray") {
            let dt = obj.getattr("dtype")?;
            let kind: String = dt.getattr("kind")?.extract()?;
            if kind == "O" {
                return Err(refused(obj, "a NumPy array of Python objects"));
            }
            // Built-in dtypes by type string; ml_dtypes' by name.
            let dtype: String = if kind == "V" {
                dt.getattr("name")?
            } else {
                dt.getattr("str")?
            }
            .extract()?;
            let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
            let data: Vec<u8> = obj.call_method1("tobytes", ("C",))?.extract()?;
            return Ok(Value::Array { dtype, shape, data });
        }
        if is_numpy(obj, "generic") {
            return Value::at_depth(&obj.call_method0("item")?, depth);
        }
        Err(refused(obj, "it"))
    }

    /// The Python value.
    pub fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(match self {
            Value::None => py.None().into_bound(py),
            Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Value::Int(i) => i.into_pyobject(py)?.into_any(),
            Value::BigInt(s) => py.get_type::<PyInt>().call1((s,))?,
            Value::Float(f) => PyFloat::new(py, f).into_any(),
            Value::Str(s) => PyString::new(py, &s).into_any(),
            Value::Bytes(b) => PyBytes::new(py, &b).into_any(),
            Value::List(items) => {
                let items: Vec<_> = items
                    .into_iter()
                    .map(|v| v.into_py(py))
                    .collect::<PyResult<_>>()?;
                PyList::new(py, items)?.into_any()
            }
            Value::Tuple(items) => {
                let items: Vec<_> = items
                    .into_iter()
                    .map(|v| v.into_py(py))
                    .collect::<PyResult<_>>()?;
                PyTuple::new(py, items)?.into_any()
            }
            Value::Dict(pairs) => {
                let d = PyDict::new(py);
                for (k, v) in pairs {
                    d.set_item(k.into_py(py)?, v.into_py(py)?)?;
                }
                d.into_any()
            }
            Value::Array { dtype, shape, data } => {
                let numpy = py.import("numpy")?;
                let dt = numpy.call_method1("dtype", (dtype,))?;
                let buf = PyByteArray::new(py, &data);
                numpy
                    .call_method1("frombuffer", (buf, dt))?
                    .call_method1("reshape", (PyTuple::new(py, shape)?,))?
            }
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

fn refused(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    let ty = obj
        .get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    let what = if what == "it" {
        format!("a value of type {ty}")
    } else {
        what.to_string()
    };
    PyTypeError::new_err(format!(
        "rankmesh cannot send {what}: objects cross ranks as data (None, bool, int, float, str, bytes, \
         list, tuple, dict and NumPy arrays), never pickled, so that no peer can make this rank run code. \
         Send its fields instead"
    ))
}
