/* CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, init and final
 * xor 0xFFFFFFFF -- the checksum of Kafka's RecordBatch v2
 * (org.apache.kafka.common.utils.Crc32C).
 *
 * Every function takes and returns a *finished* CRC value: pass 0 to start,
 * or a previous result to continue over more bytes, so
 *     f(f(0, a, na), b, nb) == f(0, a||b, na+nb)
 * (the convention of the PyPI `crc32c` package's crc32c(data, value)).
 *
 * kb_crc32c_init() must run once before any other function (the crc32c
 * extension calls it at import, under the GIL). Afterwards all functions are
 * pure and thread-safe: they only read tables written by init.
 */
#ifndef KB_CRC32C_IMPL_H
#define KB_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Build the tables and pick the hardware or software path.
 * force_software != 0 selects the software path even when SSE4.2 exists. */
void kb_crc32c_init(int force_software);

/* 1 if kb_crc32c() uses the SSE4.2 path, 0 if the software path. */
int kb_crc32c_hardware_active(void);

/* 1 if this CPU (and build) supports the SSE4.2 path at all. */
int kb_crc32c_hardware_available(void);

/* The selected implementation (one indirect call). */
uint32_t kb_crc32c(uint32_t crc, const unsigned char *data, size_t length);

/* Slicing-by-8 table implementation; always available. */
uint32_t kb_crc32c_sw(uint32_t crc, const unsigned char *data, size_t length);

/* SSE4.2 implementation. Only call when kb_crc32c_hardware_available(). */
uint32_t kb_crc32c_hw(uint32_t crc, const unsigned char *data, size_t length);

#endif /* KB_CRC32C_IMPL_H */
