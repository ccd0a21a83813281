//! Named meshes (torch's row-major `init_device_mesh`, Megatron's order
//! strings, vLLM's layout) from Python: the library's `Mesh`, its groups as
//! `Group` handles.

use crate::arrays::Here;
use crate::errors::to_py;
use crate::handles::Handle;
use crate::Group;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rankmesh::MeshLayout;

/// A mesh of the whole world.
#[pyclass(unsendable)]
pub struct Mesh {
    mesh: Handle<rankmesh::Mesh<'static>>,
}

fn names(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

impl Mesh {
    /// Makes the mesh of `layout` (collective over the world, GIL released).
    pub fn build(
        py: Python<'_>,
        rt: &'static rankmesh::Runtime,
        layout: rankmesh::Result<MeshLayout>,
        intra_node: Vec<String>,
    ) -> PyResult<Mesh> {
        let layout = layout.map_err(to_py)?;
        let rt = Here::new(rt);
        let mesh = py
            .detach(move || {
                rankmesh::Mesh::new(rt.get(), layout, &names(&intra_node)).map(Here::new)
            })
            .map_err(to_py)?
            .get();
        Ok(Mesh {
            mesh: Handle::new(mesh),
        })
    }

    fn with<R>(&self, f: impl FnOnce(&rankmesh::Mesh<'static>) -> PyResult<R>) -> PyResult<R> {
        let mesh = self.mesh.borrow();
        let mesh = mesh
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("rankmesh has been finalized"))?;
        f(mesh)
    }
}

#[pymethods]
impl Mesh {
    /// The group of this rank over the named dimensions (several: one
    /// flattened group, collective over the world at its first use).
    fn group(&self, py: Python<'_>, dims: Vec<String>) -> PyResult<Group> {
        self.with(|mesh| {
            let mesh = Here::new(mesh);
            let g = py
                .detach(move || mesh.get().group(&names(&dims)).map(Here::new))
                .map_err(to_py)?
                .get();
            Ok(Group::new(g))
        })
    }

    /// Every group over the named dimensions, as world ranks (the layout
    /// alone: no communication).
    fn groups(&self, dims: Vec<String>) -> PyResult<Vec<Vec<usize>>> {
        self.with(|mesh| mesh.layout().groups(&names(&dims)).map_err(to_py))
    }

    /// This rank's coordinate along each dimension, in the mesh's order.
    fn coords(&self) -> PyResult<Vec<(String, usize)>> {
        self.with(|mesh| {
            Ok(mesh
                .coords()
                .into_iter()
                .map(|(n, c)| (n.to_string(), c))
                .collect())
        })
    }

    /// The dimensions and their sizes, in the mesh's order.
    fn dims(&self) -> PyResult<Vec<(String, usize)>> {
        self.with(|mesh| {
            Ok(mesh
                .layout()
                .dims()
                .map(|(n, s)| (n.to_string(), s))
                .collect())
        })
    }
}
