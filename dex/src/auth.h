/* Authentication of every DEX connection: the origin's bootstrap socket
 * (which also carries the UCX address exchange) and dexrun's requests to a
 * dexnode agent. Both ends hold a 32-byte key (a run's DEX_RUN_SECRET, or
 * the agent's secret file) and prove it without sending it:
 *
 *   server -> client   "DEXAUTH1", nonce_s (32 bytes)
 *   client -> server   nonce_c (32), HMAC(key, "dex client" | nonce_s | nonce_c)
 *   server -> client   HMAC(key, "dex server" | nonce_s | nonce_c)
 *
 * The server answers only a valid client proof (a wrong key is told nothing
 * but a closed connection); the client checks the server's answer too, so
 * neither side accepts work from an impostor. Both then share a session key
 * HMAC(key, "dex session" | nonce_s | nonce_c) (the UCX transport tags its
 * messages with values derived from it). HMAC-SHA256 and the constant-time
 * comparison are nettle's. This authenticates each connection when it is
 * made; the bytes that follow are neither encrypted nor signed (a private
 * network is still assumed against eavesdroppers). */
#ifndef DEX_AUTH_H
#define DEX_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEX_AUTH_BYTES 32 /* key, nonce, MAC and session key sizes */
#define DEX_AUTH_HEX (2 * DEX_AUTH_BYTES)
#define DEX_AUTH_MAGIC "DEXAUTH1"
#define DEX_AUTH_CHALLENGE_BYTES (8 + DEX_AUTH_BYTES)
#define DEX_AUTH_PROOF_BYTES (2 * DEX_AUTH_BYTES)
#define DEX_AUTH_ENV "DEX_RUN_SECRET"
/* How long either side waits for the other's part of the exchange. */
#define DEX_AUTH_TIMEOUT_MS 5000

struct dex_auth_key {
	uint8_t bytes[DEX_AUTH_BYTES];
};

/* One side's state during the exchange. */
struct dex_auth_exchange {
	uint8_t server_nonce[DEX_AUTH_BYTES];
	uint8_t client_nonce[DEX_AUTH_BYTES];
};

/* Fills `buf` from the kernel's random source; 0 or -1. */
int dex_auth_random(void *buf, size_t len);
/* Blocking whole-buffer read and write (dexrun and dexnode's agent
 * connection, node_agent_wire.h); 0, or -1 on an error or end of file. */
int dex_read_all(int fd, void *buf, size_t len);
int dex_write_all(int fd, const void *buf, size_t len);

/* Parses exactly 64 hex digits. NULL, or why not. */
const char *dex_auth_key_from_hex(const char *text, struct dex_auth_key *key);
void dex_auth_key_to_hex(const struct dex_auth_key *key, char hex[DEX_AUTH_HEX + 1]);

/* Reads a key file (64 hex digits, an optional newline) that only its owner
 * may read. NULL, or a static reason (the caller names the file). */
const char *dex_auth_key_from_file(const char *path, struct dex_auth_key *key);

/* A key derived from `key` for one purpose named by `label` and `salt`
 * (dexnode gives each run launched through it HMAC(agent key, run id)). */
void dex_auth_derive(const struct dex_auth_key *key, const char *label, const void *salt, size_t salt_len,
		     struct dex_auth_key *out);

/* Server side: a fresh challenge to send. 0 or -1 (no randomness). */
int dex_auth_challenge(struct dex_auth_exchange *x, uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES]);
/* Server side: checks the client's proof; on success fills the answer to
 * send and the session key. */
bool dex_auth_check_proof(const struct dex_auth_key *key, struct dex_auth_exchange *x,
			  const uint8_t proof[DEX_AUTH_PROOF_BYTES], uint8_t answer[DEX_AUTH_BYTES],
			  uint8_t session[DEX_AUTH_BYTES]);
/* Client side: the proof for a challenge; NULL, or why the challenge is no
 * DEX challenge. */
const char *dex_auth_prove(const struct dex_auth_key *key, struct dex_auth_exchange *x,
			   const uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES], uint8_t proof[DEX_AUTH_PROOF_BYTES]);
/* Client side: checks the server's answer and fills the session key. */
bool dex_auth_check_answer(const struct dex_auth_key *key, const struct dex_auth_exchange *x,
			   const uint8_t answer[DEX_AUTH_BYTES], uint8_t session[DEX_AUTH_BYTES]);

/* The whole exchange on a connected blocking socket, each read bounded by
 * DEX_AUTH_TIMEOUT_MS, except that the client waits up to `wait_ms` for the
 * challenge (a server that takes one connection at a time may be busy with
 * another). NULL on success, or a static reason naming what went wrong (for
 * the caller's log line). */
const char *dex_auth_serve(int fd, const struct dex_auth_key *key, uint8_t session[DEX_AUTH_BYTES]);
const char *dex_auth_join(int fd, const struct dex_auth_key *key, int wait_ms, uint8_t session[DEX_AUTH_BYTES]);

/* The UCX tag of messages `sender` sends on the connection whose session
 * key is `session`: the sender's node number in the low 8 bits, a 55-bit
 * value only the two ends can compute above it, bit 63 clear. */
uint64_t dex_auth_tag(const uint8_t session[DEX_AUTH_BYTES], unsigned sender);

#endif
