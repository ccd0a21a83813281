//! rankmesh's NCCL and CUDA-driver declarations held to the real headers
//! (`nccl.h` 2.32.3 and `cuda.h` from their PyPI wheels, fetched by
//! `scripts/fetch-nccl.sh`).
//!
//! The test reads rankmesh's own declarations from its source — every entry
//! point of `nccl::sys::Api` with the symbol `Api::load` resolves it from,
//! the lone `extern "C"` signatures of the loaders (`ncclGetVersion`,
//! `cuDriverGetVersion`), and every constant of `nccl::sys` — and writes
//! C++ that `static_assert`s each against the header: the number of
//! parameters, each parameter's and the result's ABI class (4-byte integer
//! or enum, 8-byte unsigned, const or mutable pointer, a struct of its
//! size), each enum value, `sizeof(ncclUniqueId)`, and the offset and size
//! of each field of the `ncclConfig_t` prefix rankmesh fills in. Changing one Rust
//! prototype or value fails the compile, naming it.
//!
//! nccl.h includes `cuda_runtime.h` for two handle types only; the real one
//! needs nvcc's `crt/` headers, so a two-line stand-in defines them as
//! `driver_types.h` does (`support::real_nccl_includes`). Everything else is
//! the real header. The NCCL emulator compiles against the same headers
//! (tests/emulator/mod.rs), so its definitions cannot drift either.

mod support;

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Splits `s` at commas outside brackets.
fn top_level(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' | '<' | '[' => depth += 1,
            '>' if cur.ends_with('-') => {} // `->`
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Code without `//` comments, whitespace runs as one space.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `(params, result)` of `unsafe extern "C" fn(...) -> R` at the start of `s`.
fn signature(s: &str) -> (Vec<String>, String) {
    let s = s.trim();
    let s = s.strip_prefix("unsafe extern \"C\" fn(").expect(s);
    let mut depth = 1;
    let end = s
        .char_indices()
        .find(|(_, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            depth == 0
        })
        .expect("closing parenthesis")
        .0;
    let params = top_level(&s[..end]);
    let rest = s[end + 1..].trim();
    let ret = rest
        .strip_prefix("->")
        .map(|r| {
            r.split([',', ';', '('])
                .next()
                .unwrap_or("")
                .trim()
                .trim_end_matches(['>', ' '])
                .to_string()
        })
        .unwrap_or_else(|| "()".into());
    (params, ret)
}

/// The ABI class the C++ side computes for a Rust type rankmesh declares.
fn class(rust: &str) -> Result<u32, String> {
    let t = rust.replace(' ', "");
    if t.starts_with("*const") {
        return Ok(1);
    }
    if t.starts_with("*mut") {
        return Ok(2);
    }
    Ok(match t.as_str() {
        "c_int" | "NcclResult" => 3,
        "usize" => 4,
        // `ncclComm_t` and `cudaStream_t` are mutable pointers in C.
        "RawComm" | "RawStream" | "RawWindow" => 2,
        "UniqueId" => 100 + 128,
        other => return Err(format!("no ABI class for Rust type `{other}`: add it")),
    })
}

/// The C name of each `nccl::sys` constant.
fn c_name(rust: &str) -> Option<&'static str> {
    Some(match rust {
        "SUCCESS" => "ncclSuccess",
        "IN_PROGRESS" => "ncclInProgress",
        "UNIQUE_ID_BYTES" => "NCCL_UNIQUE_ID_BYTES",
        "INT8" => "ncclInt8",
        "UINT8" => "ncclUint8",
        "INT32" => "ncclInt32",
        "UINT32" => "ncclUint32",
        "INT64" => "ncclInt64",
        "UINT64" => "ncclUint64",
        "FLOAT16" => "ncclFloat16",
        "FLOAT32" => "ncclFloat32",
        "FLOAT64" => "ncclFloat64",
        "BFLOAT16" => "ncclBfloat16",
        "FLOAT8_E4M3" => "ncclFloat8e4m3",
        "FLOAT8_E5M2" => "ncclFloat8e5m2",
        "SUM" => "ncclSum",
        "PROD" => "ncclProd",
        "MAX" => "ncclMax",
        "MIN" => "ncclMin",
        "AVG" => "ncclAvg",
        "SPLIT_NOCOLOR" => "NCCL_SPLIT_NOCOLOR",
        "SHRINK_ABORT" => "NCCL_SHRINK_ABORT",
        "CONFIG_UNDEF_INT" => "NCCL_CONFIG_UNDEF_INT",
        "API_MAGIC" => "NCCL_API_MAGIC",
        "WIN_COLL_SYMMETRIC" => "NCCL_WIN_COLL_SYMMETRIC",
        _ => return None,
    })
}

/// Every entry point rankmesh declares: (C symbol, params, result).
fn entry_points() -> Vec<(String, Vec<String>, String)> {
    let sys = code(&std::fs::read_to_string(repo().join("src/nccl/sys.rs")).unwrap());
    // The function-pointer aliases (`type CollFn = unsafe extern "C" fn(..)`).
    let aliases: std::collections::HashMap<String, (Vec<String>, String)> = sys
        .split("type ")
        .skip(1)
        .filter_map(|t| {
            let (name, rest) = t.split_once(" = ")?;
            rest.starts_with("unsafe extern")
                .then(|| (name.trim().to_string(), signature(rest)))
        })
        .collect();
    let body_at = sys.find("pub struct Api {").expect("struct Api") + "pub struct Api {".len();
    let body_end = body_at + sys[body_at..].find('}').unwrap();
    let mut out = Vec::new();
    for field in top_level(&sys[body_at..body_end]) {
        let field = field.trim_start_matches("pub ").trim();
        let (name, ty) = field.split_once(':').expect(field);
        let ty = ty.trim();
        let ty = ty
            .strip_prefix("Option<")
            .and_then(|t| t.strip_suffix('>'))
            .unwrap_or(ty);
        let (params, ret) = match ty {
            "c_int" => continue, // `version`, a value
            alias if aliases.contains_key(alias) => aliases[alias].clone(),
            _ => signature(ty),
        };
        let key = format!(" {}: sym(lib, \"", name.trim());
        let at = sys
            .find(&key)
            .unwrap_or_else(|| panic!("Api::load resolves no `{name}`"))
            + key.len();
        let symbol = sys[at..].split('"').next().unwrap().to_string();
        out.push((symbol, params, ret));
    }
    // The loaders' lone signatures: `extern "C" fn(...) -> R` then b"NAME\0".
    for file in ["src/nccl/loader.rs", "src/device/driver.rs"] {
        let text = code(&std::fs::read_to_string(repo().join(file)).unwrap());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("unsafe extern \"C\" fn(") {
            let (params, ret) = signature(&rest[at..]);
            let name_at = rest[at..]
                .find("b\"")
                .expect("a symbol name after the signature");
            let name = rest[at + name_at + 2..]
                .split('\\')
                .next()
                .unwrap()
                .to_string();
            out.push((name, params, ret));
            rest = &rest[at + name_at + 2..];
        }
    }
    out
}

/// Every `pub const NAME: T = V;` of nccl::sys.
fn constants() -> Vec<(String, i64)> {
    let sys = code(&std::fs::read_to_string(repo().join("src/nccl/sys.rs")).unwrap());
    sys.split("pub const ")
        .skip(1)
        .map(|c| {
            let (name, rest) = c.split_once(':').unwrap();
            let value = rest.split('=').nth(1).unwrap().split(';').next().unwrap();
            let value = value.trim();
            let value = match value.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).unwrap(),
                None => value.parse().unwrap(),
            };
            (name.trim().to_string(), value)
        })
        .collect()
}

/// `nccl::sys::Config`'s fields in order: (C field, size in bytes).
fn config_fields() -> Vec<(String, usize)> {
    let sys = code(&std::fs::read_to_string(repo().join("src/nccl/sys.rs")).unwrap());
    let at = sys.find("pub struct Config {").expect("struct Config") + "pub struct Config {".len();
    let end = at + sys[at..].find('}').unwrap();
    top_level(&sys[at..end])
        .iter()
        .map(|f| {
            let (name, ty) = f.trim_start_matches("pub ").split_once(':').unwrap();
            let size = match ty.trim() {
                "usize" => 8,
                "c_int" | "c_uint" => 4,
                t if t.starts_with('*') => 8,
                t => panic!("no size for Config field type {t}: add it"),
            };
            // snake_case to NCCL's camelCase, "ctas" as "CTAs".
            let mut c = String::new();
            for (i, part) in name.trim().split('_').enumerate() {
                match (i, part) {
                    (0, p) => c += p,
                    (_, "ctas") => c += "CTAs",
                    (_, p) => c += &(p[..1].to_uppercase() + &p[1..]),
                }
            }
            (c, size)
        })
        .collect()
}

/// C++ holding rankmesh's declarations to the headers.
fn probe() -> Result<String, String> {
    let mut cpp = String::from(
        r#"#include <nccl.h>
#include <cuda.h>
#include <cstddef>
#include <tuple>
#include <type_traits>
template <class T> constexpr int abi() {
    if constexpr (std::is_pointer_v<T>) return std::is_const_v<std::remove_pointer_t<T>> ? 1 : 2;
    else if constexpr ((std::is_enum_v<T> || std::is_integral_v<T>) && sizeof(T) == 4) return 3;
    else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && sizeof(T) == 8) return 4;
    else if constexpr (std::is_class_v<T>) return 100 + sizeof(T);
    else return 0;
}
template <class F> struct sig;
template <class R, class... A> struct sig<R(A...)> {
    static constexpr std::size_t arity = sizeof...(A);
    using ret = R;
    template <std::size_t I> using arg = std::tuple_element_t<I, std::tuple<A...>>;
};
"#,
    );
    for (symbol, params, ret) in entry_points() {
        let f = format!("sig<decltype({symbol})>");
        cpp += &format!(
            "static_assert({f}::arity == {n}, \"{symbol}: rankmesh declares {n} parameters\");\n",
            n = params.len()
        );
        for (i, p) in params.iter().enumerate() {
            cpp += &format!(
                "static_assert(abi<{f}::arg<{i}>>() == {c}, \"{symbol} parameter {i}: rankmesh declares {p}\");\n",
                c = class(p)?
            );
        }
        cpp += &format!(
            "static_assert(abi<{f}::ret>() == {c}, \"{symbol}: rankmesh declares it returns {ret}\");\n",
            c = class(&ret)?
        );
    }
    for (name, value) in constants() {
        let c =
            c_name(&name).ok_or_else(|| format!("nccl::sys::{name} has no C name here: add it"))?;
        cpp += &format!("static_assert({c} == {value}, \"rankmesh's {name} = {value}\");\n");
    }
    // The config prefix: each field at the header's offset with its size
    // (C layout: every field at a multiple of its size).
    let mut offset = 0usize;
    for (field, size) in config_fields() {
        offset = offset.div_ceil(size) * size;
        cpp += &format!(
            "static_assert(offsetof(ncclConfig_t, {field}) == {offset} && sizeof(ncclConfig_t::{field}) == {size}, \"ncclConfig_t.{field}: rankmesh puts {size} bytes at {offset}\");\n"
        );
        offset += size;
    }
    cpp += &format!("static_assert(sizeof(ncclConfig_t) >= {offset}, \"ncclConfig_t prefix\");\n");
    cpp += "static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, \"ncclUniqueId\");\nint main() { return 0; }\n";
    Ok(cpp)
}

#[test]
fn declarations_match_nccl_h_and_cuda_h() {
    let dir = std::env::temp_dir().join(format!("rankmesh-nccl-abi-{}", std::process::id()));
    let Some(includes) = support::real_nccl_includes(&dir) else {
        return;
    };
    let cpp = probe().unwrap();
    let points = entry_points();
    assert!(points.len() >= 29, "{points:?}");
    assert_eq!(config_fields().len(), 9);
    std::fs::write(dir.join("abi.cc"), &cpp).unwrap();
    let out = Command::new("g++")
        .args(["-std=c++17", "-fsyntax-only"])
        .args(includes.iter().map(|d| format!("-I{}", d.display())))
        .arg(dir.join("abi.cc"))
        .output()
        .expect("g++");
    let errors = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "rankmesh's declarations against nccl.h / cuda.h:\n{}",
        errors
            .lines()
            .filter(|l| l.contains("static assertion failed") || l.contains("error:"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
