// ggml block formats (docs/formats.md §2.3, §3): block sizes, dequantization of a row to fp32, and the
// reference quantizers (ggml `quantize_row_*_ref`) used by tests and the GGUF writer.
// Plain scalar loops; every field is read with memcpy (blocks are packed, unaligned structs).
#pragma once

#include <cstddef>
#include <cstdint>

namespace infoflow {

// Block geometry of a ggml type; false for ids that are unknown or retired.
bool ggml_type_known(uint32_t type);
int64_t ggml_block_elems(uint32_t type);  // throws naming the type when unknown
size_t ggml_block_bytes(uint32_t type);   // throws naming the type when unknown
// Bytes of `n` elements; throws when the type is unknown or n is not a multiple of the block.
size_t ggml_row_bytes(uint32_t type, int64_t n);

// Types this runtime can turn into fp32: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K.
bool ggml_type_dequantizable(uint32_t type);
// Types quantize_row can produce: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
bool ggml_type_quantizable(uint32_t type);

// src: ggml_row_bytes(type, n) bytes (any alignment); dst: [n]. `n` must be a multiple of the
// type's block size. Unsupported types throw an error naming the type.
void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n);
// src: [n]; dst: ggml_row_bytes(type, n) bytes. Reference (non-optimizing) quantizers.
void quantize_row(uint32_t type, const float* src, uint8_t* dst, int64_t n);

void dequantize_row_f32(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_f16(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_bf16(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q4_0(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q4_1(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q5_0(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q5_1(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q8_0(const uint8_t* src, float* dst, int64_t n);
void dequantize_row_q6_k(const uint8_t* src, float* dst, int64_t n);

void quantize_row_f16_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_bf16_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q4_0_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q4_1_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q5_0_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q5_1_ref(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q8_0_ref(const float* src, uint8_t* dst, int64_t n);

}  // namespace infoflow
