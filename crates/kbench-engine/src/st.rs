//! Safetensors checkpoints: memory-mapped reading (single file or sharded with
//! `model.safetensors.index.json`), typed zero-copy views, and a streaming writer.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kbench_numerics::bf16;
use memmap2::Mmap;
pub use safetensors::Dtype;
use safetensors::SafeTensors;

use crate::error::{io_err, write_err, EngineError, Result};

/// Bytes a tensor lives in: a mapped file or memory the process owns.
#[derive(Debug)]
pub enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One tensor of a checkpoint: dtype, shape and where its bytes are.
#[derive(Debug, Clone)]
pub struct TensorRef {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    backing: Arc<Backing>,
    start: usize,
    len: usize,
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        &self.backing.bytes()[self.start..self.start + self.len]
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Plain-old-data element types a [`Slice`] can view.
pub trait Pod: Copy + Default + Send + Sync + 'static {
    fn from_le(bytes: &[u8]) -> Self;
}
impl Pod for u16 {
    fn from_le(b: &[u8]) -> Self {
        u16::from_le_bytes([b[0], b[1]])
    }
}
impl Pod for u32 {
    fn from_le(b: &[u8]) -> Self {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// A typed, read-only array that is either a zero-copy view into a mapping (when the
/// bytes are aligned) or an owned copy.
#[derive(Debug, Clone)]
pub enum Slice<T: Pod> {
    Shared {
        backing: Arc<Backing>,
        start: usize,
        len: usize,
    },
    Owned(Arc<Vec<T>>),
}

impl<T: Pod> Slice<T> {
    pub fn from_vec(v: Vec<T>) -> Slice<T> {
        Slice::Owned(Arc::new(v))
    }

    fn from_tensor(t: &TensorRef) -> Slice<T> {
        let size = std::mem::size_of::<T>();
        let bytes = t.bytes();
        let little_endian = cfg!(target_endian = "little");
        if little_endian && (bytes.as_ptr() as usize) % std::mem::align_of::<T>() == 0 {
            Slice::Shared {
                backing: t.backing.clone(),
                start: t.start,
                len: t.len / size,
            }
        } else {
            Slice::Owned(Arc::new(bytes.chunks_exact(size).map(T::from_le).collect()))
        }
    }

    pub fn as_slice(&self) -> &[T] {
        match self {
            Slice::Shared {
                backing,
                start,
                len,
            } => {
                let bytes = &backing.bytes()[*start..*start + *len * std::mem::size_of::<T>()];
                // SAFETY: alignment and length were checked when the view was made, the
                // backing is immutable and outlives `self` (Arc), and T is plain old data
                // valid for every bit pattern on a little-endian host.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, *len) }
            }
            Slice::Owned(v) => v,
        }
    }
}

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

/// Every tensor of a checkpoint directory (or an in-memory set), by name.
#[derive(Debug, Clone)]
pub struct WeightStore {
    pub dir: PathBuf,
    tensors: HashMap<String, TensorRef>,
}

impl WeightStore {
    /// Opens `dir/model.safetensors.index.json` (sharded) or `dir/model.safetensors`, or
    /// failing both every `*.safetensors` file in `dir`.
    pub fn open(dir: &Path) -> Result<WeightStore> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(io_err(&index))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| EngineError::Json {
                    path: index.clone(),
                    message: e.to_string(),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| EngineError::Json {
                    path: index.clone(),
                    message: "no `weight_map` object".into(),
                })?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            files.sort();
            files.dedup();
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if dir.join("model.safetensors").exists() {
            vec![dir.join("model.safetensors")]
        } else {
            let rd = std::fs::read_dir(dir).map_err(io_err(dir))?;
            let mut files: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(EngineError::Io {
                    path: dir.join("model.safetensors"),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no safetensors files (model.safetensors or a sharded index)",
                    ),
                });
            }
            files
        };
        let mut tensors = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(io_err(&path))?;
            // SAFETY: the checkpoint is read-only for the life of the process; a file
            // truncated under us is the same hazard every mmap-based loader accepts.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
            let backing = Arc::new(Backing::Map(map));
            Self::index_file(&path, backing, &mut tensors)?;
        }
        Ok(WeightStore {
            dir: dir.to_path_buf(),
            tensors,
        })
    }

    fn index_file(
        path: &Path,
        backing: Arc<Backing>,
        out: &mut HashMap<String, TensorRef>,
    ) -> Result<()> {
        let buf = backing.bytes();
        let st = SafeTensors::deserialize(buf).map_err(|e| EngineError::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let base = buf.as_ptr() as usize;
        for (name, view) in st.tensors() {
            let data = view.data();
            out.insert(
                name,
                TensorRef {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    backing: backing.clone(),
                    start: data.as_ptr() as usize - base,
                    len: data.len(),
                },
            );
        }
        Ok(())
    }

    /// An in-memory store (tests, models built without touching the disk).
    pub fn from_tensors(tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) -> WeightStore {
        let mut map = HashMap::new();
        for (name, dtype, shape, bytes) in tensors {
            let len = bytes.len();
            map.insert(
                name,
                TensorRef {
                    dtype,
                    shape,
                    backing: Arc::new(Backing::Owned(bytes)),
                    start: 0,
                    len,
                },
            );
        }
        WeightStore {
            dir: PathBuf::from("<memory>"),
            tensors: map,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Result<&TensorRef> {
        self.tensors
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.into(),
                dir: self.dir.clone(),
            })
    }

    fn checked(&self, name: &str, shape: &[usize]) -> Result<&TensorRef> {
        let t = self.get(name)?;
        if t.shape != shape {
            return Err(EngineError::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                got: t.shape.clone(),
            });
        }
        Ok(t)
    }

    /// A float tensor of the given shape as f32 (BF16, F16 or F32 on disk).
    pub fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.checked(name, shape)?;
        let b = t.bytes();
        Ok(match t.dtype {
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(EngineError::Dtype {
                    name: name.into(),
                    expected: "BF16, F16 or F32".into(),
                    got: dtype_name(other),
                })
            }
        })
    }

    /// A BF16 matrix as raw bits, zero-copy when aligned. F16/F32 are rounded to BF16.
    pub fn bf16s(&self, name: &str, shape: &[usize]) -> Result<Slice<u16>> {
        let t = self.checked(name, shape)?;
        match t.dtype {
            Dtype::BF16 => Ok(Slice::from_tensor(t)),
            Dtype::F16 | Dtype::F32 => Ok(Slice::from_vec(
                self.f32s(name, shape)?
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect(),
            )),
            other => Err(EngineError::Dtype {
                name: name.into(),
                expected: "BF16".into(),
                got: dtype_name(other),
            }),
        }
    }

    /// An I32 tensor as u32 words (INT4 packed weights), zero-copy when aligned.
    pub fn words(&self, name: &str, shape: &[usize]) -> Result<Slice<u32>> {
        let t = self.checked(name, shape)?;
        if t.dtype != Dtype::I32 && t.dtype != Dtype::U32 {
            return Err(EngineError::Dtype {
                name: name.into(),
                expected: "I32".into(),
                got: dtype_name(t.dtype),
            });
        }
        Ok(Slice::from_tensor(t))
    }

    /// Integer tensor (I64 or I32) of any shape as i64.
    pub fn ints(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let t = self.get(name)?;
        let b = t.bytes();
        let v = match t.dtype {
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunk of 8")))
                .collect(),
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("chunk of 4")) as i64)
                .collect(),
            other => {
                return Err(EngineError::Dtype {
                    name: name.into(),
                    expected: "I64 or I32".into(),
                    got: dtype_name(other),
                })
            }
        };
        Ok((t.shape.clone(), v))
    }
}

/// What the streaming writer needs to know up front about one tensor.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorPlan {
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Writes one safetensors file without holding its tensors in memory: the header is
/// written from the plan, then each tensor's bytes are streamed in plan order.
pub struct StreamWriter {
    path: PathBuf,
    out: BufWriter<File>,
    plan: Vec<TensorPlan>,
    next: usize,
    written_in_current: usize,
}

impl StreamWriter {
    pub fn create(path: &Path, plan: Vec<TensorPlan>) -> Result<StreamWriter> {
        let mut header = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        meta.insert("format".into(), "pt".into());
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
        let mut offset = 0usize;
        for t in &plan {
            let n = t.nbytes();
            header.insert(
                t.name.clone(),
                serde_json::json!({
                    "dtype": dtype_str(t.dtype),
                    "shape": t.shape,
                    "data_offsets": [offset, offset + n],
                }),
            );
            offset += n;
        }
        let mut text = serde_json::to_string(&serde_json::Value::Object(header))
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        while text.len() % 8 != 0 {
            text.push(' ');
        }
        let file = File::create(path).map_err(write_err(path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(text.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(text.as_bytes()))
            .map_err(write_err(path))?;
        Ok(StreamWriter {
            path: path.to_path_buf(),
            out,
            plan,
            next: 0,
            written_in_current: 0,
        })
    }

    /// Appends bytes of the current tensor; a tensor may be written in several pieces.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let t = self.plan.get(self.next).ok_or_else(|| {
                EngineError::Invalid(format!("{}: more bytes than planned", self.path.display()))
            })?;
            let room = t.nbytes() - self.written_in_current;
            let n = room.min(rest.len());
            self.out
                .write_all(&rest[..n])
                .map_err(write_err(&self.path))?;
            self.written_in_current += n;
            rest = &rest[n..];
            if self.written_in_current == t.nbytes() {
                self.next += 1;
                self.written_in_current = 0;
            }
        }
        // Zero-sized tensors complete without bytes.
        while self.plan.get(self.next).is_some_and(|t| t.nbytes() == 0) {
            self.next += 1;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<()> {
        while self.plan.get(self.next).is_some_and(|t| t.nbytes() == 0) {
            self.next += 1;
        }
        if self.next != self.plan.len() {
            return Err(EngineError::Invalid(format!(
                "{}: tensor `{}` was not fully written",
                self.path.display(),
                self.plan[self.next].name
            )));
        }
        self.out.flush().map_err(write_err(&self.path))
    }
}

pub fn dtype_str(d: Dtype) -> &'static str {
    match d {
        Dtype::BOOL => "BOOL",
        Dtype::U8 => "U8",
        Dtype::I8 => "I8",
        Dtype::I16 => "I16",
        Dtype::U16 => "U16",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::I32 => "I32",
        Dtype::U32 => "U32",
        Dtype::F32 => "F32",
        Dtype::F64 => "F64",
        Dtype::I64 => "I64",
        Dtype::U64 => "U64",
        _ => "UNKNOWN",
    }
}

/// Writes `model.safetensors.index.json` for shards: tensor name -> file name.
pub fn write_index(
    dir: &Path,
    weight_map: &BTreeMap<String, String>,
    total_size: u64,
) -> Result<()> {
    let v = serde_json::json!({
        "metadata": {"total_size": total_size},
        "weight_map": weight_map,
    });
    let path = dir.join("model.safetensors.index.json");
    let text = serde_json::to_string_pretty(&v).map_err(|e| EngineError::Invalid(e.to_string()))?;
    std::fs::write(&path, text).map_err(write_err(&path))
}
