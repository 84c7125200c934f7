from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DepthScaling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPTH_SCALING_NONE: _ClassVar[DepthScaling]
    DEPTH_SCALING_N_LAYERS: _ClassVar[DepthScaling]
    DEPTH_SCALING_LAYER: _ClassVar[DepthScaling]

class Bounds(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BOUNDS_SIGMA: _ClassVar[Bounds]
    BOUNDS_ABSOLUTE: _ClassVar[Bounds]
DEPTH_SCALING_NONE: DepthScaling
DEPTH_SCALING_N_LAYERS: DepthScaling
DEPTH_SCALING_LAYER: DepthScaling
BOUNDS_SIGMA: Bounds
BOUNDS_ABSOLUTE: Bounds

class ModelRequest(_message.Message):
    __slots__ = ("spec", "policy", "seed", "dtype", "max_shard_size", "algorithm_version")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_VERSION_FIELD_NUMBER: _ClassVar[int]
    spec: ModelSpec
    policy: Policy
    seed: int
    dtype: str
    max_shard_size: str
    algorithm_version: int
    def __init__(self, spec: _Optional[_Union[ModelSpec, _Mapping]] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., seed: _Optional[int] = ..., dtype: _Optional[str] = ..., max_shard_size: _Optional[str] = ..., algorithm_version: _Optional[int] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("preset", "config_json", "architecture")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    preset: str
    config_json: str
    architecture: str
    def __init__(self, preset: _Optional[str] = ..., config_json: _Optional[str] = ..., architecture: _Optional[str] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("preset", "rules")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    preset: str
    rules: _containers.RepeatedCompositeFieldContainer[Rule]
    def __init__(self, preset: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[Rule, _Mapping]]] = ...) -> None: ...

class Rule(_message.Message):
    __slots__ = ("match", "init", "depth_scaling", "zero_padding_row", "name")
    MATCH_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_SCALING_FIELD_NUMBER: _ClassVar[int]
    ZERO_PADDING_ROW_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    match: Match
    init: Distribution
    depth_scaling: DepthScaling
    zero_padding_row: bool
    name: str
    def __init__(self, match: _Optional[_Union[Match, _Mapping]] = ..., init: _Optional[_Union[Distribution, _Mapping]] = ..., depth_scaling: _Optional[_Union[DepthScaling, str]] = ..., zero_padding_row: _Optional[bool] = ..., name: _Optional[str] = ...) -> None: ...

class Match(_message.Message):
    __slots__ = ("kinds", "roles", "params", "names", "min_layer", "max_layer")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    MIN_LAYER_FIELD_NUMBER: _ClassVar[int]
    MAX_LAYER_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    params: _containers.RepeatedScalarFieldContainer[str]
    names: _containers.RepeatedScalarFieldContainer[str]
    min_layer: int
    max_layer: int
    def __init__(self, kinds: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., params: _Optional[_Iterable[str]] = ..., names: _Optional[_Iterable[str]] = ..., min_layer: _Optional[int] = ..., max_layer: _Optional[int] = ...) -> None: ...

class Distribution(_message.Message):
    __slots__ = ("normal", "trunc_normal", "uniform", "constant", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "lecun_normal")
    NORMAL_FIELD_NUMBER: _ClassVar[int]
    TRUNC_NORMAL_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    XAVIER_UNIFORM_FIELD_NUMBER: _ClassVar[int]
    XAVIER_NORMAL_FIELD_NUMBER: _ClassVar[int]
    KAIMING_UNIFORM_FIELD_NUMBER: _ClassVar[int]
    KAIMING_NORMAL_FIELD_NUMBER: _ClassVar[int]
    LECUN_NORMAL_FIELD_NUMBER: _ClassVar[int]
    normal: Normal
    trunc_normal: TruncNormal
    uniform: Uniform
    constant: Constant
    xavier_uniform: FanScaled
    xavier_normal: FanScaled
    kaiming_uniform: FanScaled
    kaiming_normal: FanScaled
    lecun_normal: FanScaled
    def __init__(self, normal: _Optional[_Union[Normal, _Mapping]] = ..., trunc_normal: _Optional[_Union[TruncNormal, _Mapping]] = ..., uniform: _Optional[_Union[Uniform, _Mapping]] = ..., constant: _Optional[_Union[Constant, _Mapping]] = ..., xavier_uniform: _Optional[_Union[FanScaled, _Mapping]] = ..., xavier_normal: _Optional[_Union[FanScaled, _Mapping]] = ..., kaiming_uniform: _Optional[_Union[FanScaled, _Mapping]] = ..., kaiming_normal: _Optional[_Union[FanScaled, _Mapping]] = ..., lecun_normal: _Optional[_Union[FanScaled, _Mapping]] = ...) -> None: ...

class Normal(_message.Message):
    __slots__ = ("mean", "std")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    mean: float
    std: float
    def __init__(self, mean: _Optional[float] = ..., std: _Optional[float] = ...) -> None: ...

class TruncNormal(_message.Message):
    __slots__ = ("mean", "std", "a", "b", "bounds", "preserve_std")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    PRESERVE_STD_FIELD_NUMBER: _ClassVar[int]
    mean: float
    std: float
    a: float
    b: float
    bounds: Bounds
    preserve_std: bool
    def __init__(self, mean: _Optional[float] = ..., std: _Optional[float] = ..., a: _Optional[float] = ..., b: _Optional[float] = ..., bounds: _Optional[_Union[Bounds, str]] = ..., preserve_std: _Optional[bool] = ...) -> None: ...

class Uniform(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: float
    high: float
    def __init__(self, low: _Optional[float] = ..., high: _Optional[float] = ...) -> None: ...

class Constant(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class FanScaled(_message.Message):
    __slots__ = ("gain", "negative_slope", "mode", "nonlinearity")
    GAIN_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_SLOPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NONLINEARITY_FIELD_NUMBER: _ClassVar[int]
    gain: float
    negative_slope: float
    mode: str
    nonlinearity: str
    def __init__(self, gain: _Optional[float] = ..., negative_slope: _Optional[float] = ..., mode: _Optional[str] = ..., nonlinearity: _Optional[str] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("request", "page_size", "page_token")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request: ModelRequest
    page_size: int
    page_token: str
    def __init__(self, request: _Optional[_Union[ModelRequest, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("algorithm_version", "fingerprint", "request", "family", "architecture", "total_params", "total_bytes", "tensors", "files", "tied", "groups", "tensor_count", "next_page_token", "base_model_prefix", "transformers_version")
    class TiedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ALGORITHM_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TIED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_PREFIX_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMERS_VERSION_FIELD_NUMBER: _ClassVar[int]
    algorithm_version: int
    fingerprint: str
    request: ModelRequest
    family: str
    architecture: str
    total_params: int
    total_bytes: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorPlan]
    files: _containers.RepeatedCompositeFieldContainer[FilePlan]
    tied: _containers.ScalarMap[str, str]
    groups: _containers.RepeatedCompositeFieldContainer[TensorGroup]
    tensor_count: int
    next_page_token: str
    base_model_prefix: str
    transformers_version: str
    def __init__(self, algorithm_version: _Optional[int] = ..., fingerprint: _Optional[str] = ..., request: _Optional[_Union[ModelRequest, _Mapping]] = ..., family: _Optional[str] = ..., architecture: _Optional[str] = ..., total_params: _Optional[int] = ..., total_bytes: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorPlan, _Mapping]]] = ..., files: _Optional[_Iterable[_Union[FilePlan, _Mapping]]] = ..., tied: _Optional[_Mapping[str, str]] = ..., groups: _Optional[_Iterable[_Union[TensorGroup, _Mapping]]] = ..., tensor_count: _Optional[int] = ..., next_page_token: _Optional[str] = ..., base_model_prefix: _Optional[str] = ..., transformers_version: _Optional[str] = ...) -> None: ...

class TensorGroup(_message.Message):
    __slots__ = ("rule", "init", "formula", "kind", "param", "roles", "shape", "example", "count", "params", "std", "effective_std", "mean", "fan_in", "fan_out", "xavier_std", "lecun_std", "ratio_xavier", "ratio_lecun", "warnings")
    RULE_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_STD_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    FAN_IN_FIELD_NUMBER: _ClassVar[int]
    FAN_OUT_FIELD_NUMBER: _ClassVar[int]
    XAVIER_STD_FIELD_NUMBER: _ClassVar[int]
    LECUN_STD_FIELD_NUMBER: _ClassVar[int]
    RATIO_XAVIER_FIELD_NUMBER: _ClassVar[int]
    RATIO_LECUN_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    rule: str
    init: str
    formula: str
    kind: str
    param: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    shape: _containers.RepeatedScalarFieldContainer[int]
    example: str
    count: int
    params: int
    std: float
    effective_std: float
    mean: float
    fan_in: int
    fan_out: int
    xavier_std: float
    lecun_std: float
    ratio_xavier: float
    ratio_lecun: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rule: _Optional[str] = ..., init: _Optional[str] = ..., formula: _Optional[str] = ..., kind: _Optional[str] = ..., param: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., shape: _Optional[_Iterable[int]] = ..., example: _Optional[str] = ..., count: _Optional[int] = ..., params: _Optional[int] = ..., std: _Optional[float] = ..., effective_std: _Optional[float] = ..., mean: _Optional[float] = ..., fan_in: _Optional[int] = ..., fan_out: _Optional[int] = ..., xavier_std: _Optional[float] = ..., lecun_std: _Optional[float] = ..., ratio_xavier: _Optional[float] = ..., ratio_lecun: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorPlan(_message.Message):
    __slots__ = ("name", "shape", "dtype", "kind", "role", "param", "layer", "fan_in", "fan_out", "padding_idx", "rule", "init", "std", "effective_std", "shard", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FAN_IN_FIELD_NUMBER: _ClassVar[int]
    FAN_OUT_FIELD_NUMBER: _ClassVar[int]
    PADDING_IDX_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_STD_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    kind: str
    role: str
    param: str
    layer: int
    fan_in: int
    fan_out: int
    padding_idx: int
    rule: str
    init: str
    std: float
    effective_std: float
    shard: int
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., kind: _Optional[str] = ..., role: _Optional[str] = ..., param: _Optional[str] = ..., layer: _Optional[int] = ..., fan_in: _Optional[int] = ..., fan_out: _Optional[int] = ..., padding_idx: _Optional[int] = ..., rule: _Optional[str] = ..., init: _Optional[str] = ..., std: _Optional[float] = ..., effective_std: _Optional[float] = ..., shard: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class FilePlan(_message.Message):
    __slots__ = ("name", "size", "shard", "tensors")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    shard: bool
    tensors: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., shard: _Optional[bool] = ..., tensors: _Optional[int] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("request", "files", "offset", "chunk_size", "transit_crc32c")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSIT_CRC32C_FIELD_NUMBER: _ClassVar[int]
    request: ModelRequest
    files: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    chunk_size: int
    transit_crc32c: bool
    def __init__(self, request: _Optional[_Union[ModelRequest, _Mapping]] = ..., files: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., chunk_size: _Optional[int] = ..., transit_crc32c: _Optional[bool] = ...) -> None: ...

class InitResponse(_message.Message):
    __slots__ = ("begin", "data", "end", "crc32c")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    begin: FileBegin
    data: bytes
    end: FileEnd
    crc32c: int
    def __init__(self, begin: _Optional[_Union[FileBegin, _Mapping]] = ..., data: _Optional[bytes] = ..., end: _Optional[_Union[FileEnd, _Mapping]] = ..., crc32c: _Optional[int] = ...) -> None: ...

class FileBegin(_message.Message):
    __slots__ = ("index", "name", "size", "offset")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    size: int
    offset: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., size: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class FileEnd(_message.Message):
    __slots__ = ("index", "sha256")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    index: int
    sha256: str
    def __init__(self, index: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class TensorsRequest(_message.Message):
    __slots__ = ("request", "selections", "chunk_size", "start", "offset", "transit_crc32c")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SELECTIONS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRANSIT_CRC32C_FIELD_NUMBER: _ClassVar[int]
    request: ModelRequest
    selections: _containers.RepeatedCompositeFieldContainer[TensorSelection]
    chunk_size: int
    start: int
    offset: int
    transit_crc32c: bool
    def __init__(self, request: _Optional[_Union[ModelRequest, _Mapping]] = ..., selections: _Optional[_Iterable[_Union[TensorSelection, _Mapping]]] = ..., chunk_size: _Optional[int] = ..., start: _Optional[int] = ..., offset: _Optional[int] = ..., transit_crc32c: _Optional[bool] = ...) -> None: ...

class TensorSelection(_message.Message):
    __slots__ = ("name", "dims")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    dims: _containers.RepeatedCompositeFieldContainer[SliceDim]
    def __init__(self, name: _Optional[str] = ..., dims: _Optional[_Iterable[_Union[SliceDim, _Mapping]]] = ...) -> None: ...

class SliceDim(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class TensorsResponse(_message.Message):
    __slots__ = ("begin", "data", "crc32c")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    begin: TensorBegin
    data: bytes
    crc32c: int
    def __init__(self, begin: _Optional[_Union[TensorBegin, _Mapping]] = ..., data: _Optional[bytes] = ..., crc32c: _Optional[int] = ...) -> None: ...

class TensorBegin(_message.Message):
    __slots__ = ("index", "name", "dtype", "tensor_shape", "dims", "shape", "nbytes", "fingerprint", "offset")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SHAPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    dtype: str
    tensor_shape: _containers.RepeatedScalarFieldContainer[int]
    dims: _containers.RepeatedCompositeFieldContainer[SliceDim]
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    fingerprint: str
    offset: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[str] = ..., tensor_shape: _Optional[_Iterable[int]] = ..., dims: _Optional[_Iterable[_Union[SliceDim, _Mapping]]] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., fingerprint: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...
