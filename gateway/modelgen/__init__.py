"""What a runtime-loaded model becomes in Triton: resolved from a local folder or the hub, turned into
generated model folders (the pipelines' generic stages) plus one ensemble per modality. Plain code, no
Triton calls: the registry loads what `generate` writes."""
from gateway.modelgen.generate import generate, remove, remove_generated
from gateway.modelgen.onnx_cache import ExportOptions
from gateway.modelgen.sources import OPEN_CLIP_MODELS, resolve_source, triton_name
from gateway.modelgen.spec import ImageLimits, ModelSpec, builtin_specs

__all__ = ["ExportOptions", "ImageLimits", "ModelSpec", "OPEN_CLIP_MODELS", "builtin_specs", "generate", "remove",
           "remove_generated", "resolve_source", "triton_name"]
