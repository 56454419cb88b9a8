//! Engine errors. Bad input (files, shapes, dtypes, configs) is always an error, never a panic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error(transparent)]
    Arch(#[from] kbench_core::arch::ArchError),
    #[error("safetensors file {path} is invalid (truncated or corrupt?): {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {got}, expected {expected}")]
    Dtype {
        name: String,
        expected: String,
        got: String,
    },
    #[error("model config and weights disagree: {0}")]
    ConfigMismatch(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The experiment asks for a device this machine does not have.
    #[error("device {device}: {why} (found {found} CUDA devices); use device = \"cpu\"")]
    DeviceUnavailable {
        device: String,
        why: &'static str,
        found: usize,
    },
    #[error("the CUDA path failed")]
    Cuda(#[source] kbench_cuda::CudaError),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A draft directory whose config.json is not an EAGLE-3 head's: most often the target's
    /// own folder given as the draft, which would otherwise be reported as the first draft
    /// field its config lacks.
    #[error(
        "{dir} is not an EAGLE-3 draft checkpoint: expected the config.json of an EAGLE-3 head \
         (architectures [\"LlamaForCausalLMEagle3\"], with hidden_size, num_attention_heads and \
         intermediate_size at its top level), found {found}"
    )]
    NotADraft {
        dir: PathBuf,
        found: String,
        #[source]
        source: kbench_core::arch::ArchError,
    },
    /// Positions past max_position_embeddings are beyond what the model was trained on, and
    /// such a run does not end in any useful time on the CPU path: refused before generating,
    /// as SGLang refuses prompt + max_new_tokens beyond its context length.
    #[error(
        "the prompt's {prompt_tokens} tokens + max_tokens {max_tokens} need {} positions, beyond \
         the model's maximum context of {context} tokens (max_position_embeddings)",
        *.prompt_tokens as u64 + *.max_tokens as u64
    )]
    ContextLength {
        prompt_tokens: usize,
        max_tokens: usize,
        context: u64,
    },
    #[error(transparent)]
    Tree(#[from] kbench_core::tree::TreeError),
    #[error(transparent)]
    Verify(#[from] kbench_core::verify::VerifyError),
    #[error(transparent)]
    Trace(#[from] kbench_core::trace::TraceError),
}

pub type Result<T> = std::result::Result<T, EngineError>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.into();
    move |source| EngineError::Io { path, source }
}

pub(crate) fn write_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.into();
    move |source| EngineError::Write { path, source }
}
