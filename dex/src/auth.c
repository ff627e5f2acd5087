/* Connection authentication (see auth.h). Plain libc calls: it runs while
 * libdex starts, in dexrun and in dexnode, never in a fault handler. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/base16.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <poll.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

enum io_op { IO_READ, IO_WRITE, IO_RANDOM };

/* Repeats one read(2), write(2) or getrandom(2) until `len` bytes are done,
 * through EINTR and short counts; 0, or -1 on an error or end of file. */
static int io_all(enum io_op op, int fd, char *p, size_t len)
{
	while (len) {
		ssize_t n = op == IO_READ ? read(fd, p, len) : op == IO_WRITE ? write(fd, p, len) : getrandom(p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int dex_auth_random(void *buf, size_t len)
{
	return io_all(IO_RANDOM, -1, buf, len);
}

int dex_read_all(int fd, void *buf, size_t len)
{
	return io_all(IO_READ, fd, buf, len);
}

int dex_write_all(int fd, const void *buf, size_t len)
{
	return io_all(IO_WRITE, fd, (char *)buf, len); /* write(2) only reads it */
}

const char *dex_auth_key_from_hex(const char *text, struct dex_auth_key *key)
{
	/* nettle's decoder skips white space: insist on the digits alone */
	if (strlen(text) != DEX_AUTH_HEX || strspn(text, "0123456789abcdefABCDEF") != DEX_AUTH_HEX)
		return "a secret is 64 hex digits";
	struct base16_decode_ctx ctx;
	size_t len = sizeof(key->bytes);
	base16_decode_init(&ctx);
	if (!base16_decode_update(&ctx, &len, key->bytes, DEX_AUTH_HEX, text) || len != sizeof(key->bytes) ||
	    !base16_decode_final(&ctx))
		return "a secret is 64 hex digits";
	return NULL;
}

void dex_auth_key_to_hex(const struct dex_auth_key *key, char hex[DEX_AUTH_HEX + 1])
{
	base16_encode_update(hex, sizeof(key->bytes), key->bytes);
	hex[DEX_AUTH_HEX] = 0;
}

const char *dex_auth_key_from_file(const char *path, struct dex_auth_key *key)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? "no such file" : "cannot open it";
	struct stat st;
	char text[DEX_AUTH_HEX + 2];
	ssize_t n = fstat(fd, &st) == 0 ? read(fd, text, sizeof(text)) : -1;
	close(fd);
	if (n < 0)
		return "cannot read it";
	if (st.st_mode & (S_IRWXG | S_IRWXO))
		return "group or others may access it (chmod 600)";
	if (n == DEX_AUTH_HEX + 1 && text[DEX_AUTH_HEX] == '\n')
		n--;
	text[n < DEX_AUTH_HEX + 1 ? n : DEX_AUTH_HEX + 1] = 0;
	return dex_auth_key_from_hex(text, key);
}

/* HMAC(key, label | a | b) */
static void mac(const uint8_t key[DEX_AUTH_BYTES], const char *label, const void *a, size_t a_len, const void *b,
		size_t b_len, uint8_t out[DEX_AUTH_BYTES])
{
	struct hmac_sha256_ctx ctx;
	hmac_sha256_set_key(&ctx, DEX_AUTH_BYTES, key);
	hmac_sha256_update(&ctx, strlen(label) + 1, (const uint8_t *)label);
	hmac_sha256_update(&ctx, a_len, a);
	hmac_sha256_update(&ctx, b_len, b);
	hmac_sha256_digest(&ctx, DEX_AUTH_BYTES, out);
}

void dex_auth_derive(const struct dex_auth_key *key, const char *label, const void *salt, size_t salt_len,
		     struct dex_auth_key *out)
{
	mac(key->bytes, label, salt, salt_len, "", 0, out->bytes);
}

static void exchange_mac(const struct dex_auth_key *key, const struct dex_auth_exchange *x, const char *label,
			 uint8_t out[DEX_AUTH_BYTES])
{
	mac(key->bytes, label, x->server_nonce, DEX_AUTH_BYTES, x->client_nonce, DEX_AUTH_BYTES, out);
}

int dex_auth_challenge(struct dex_auth_exchange *x, uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES])
{
	if (dex_auth_random(x->server_nonce, DEX_AUTH_BYTES) != 0)
		return -1;
	memcpy(challenge, DEX_AUTH_MAGIC, 8);
	memcpy(challenge + 8, x->server_nonce, DEX_AUTH_BYTES);
	return 0;
}

bool dex_auth_check_proof(const struct dex_auth_key *key, struct dex_auth_exchange *x,
			  const uint8_t proof[DEX_AUTH_PROOF_BYTES], uint8_t answer[DEX_AUTH_BYTES],
			  uint8_t session[DEX_AUTH_BYTES])
{
	uint8_t want[DEX_AUTH_BYTES];
	memcpy(x->client_nonce, proof, DEX_AUTH_BYTES);
	exchange_mac(key, x, "dex client", want);
	if (!memeql_sec(want, proof + DEX_AUTH_BYTES, DEX_AUTH_BYTES))
		return false;
	exchange_mac(key, x, "dex server", answer);
	exchange_mac(key, x, "dex session", session);
	return true;
}

const char *dex_auth_prove(const struct dex_auth_key *key, struct dex_auth_exchange *x,
			   const uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES], uint8_t proof[DEX_AUTH_PROOF_BYTES])
{
	if (memcmp(challenge, DEX_AUTH_MAGIC, 8) != 0)
		return "the other side is not a DEX peer (no DEX challenge)";
	memcpy(x->server_nonce, challenge + 8, DEX_AUTH_BYTES);
	if (dex_auth_random(x->client_nonce, DEX_AUTH_BYTES) != 0)
		return "no random numbers from the kernel";
	memcpy(proof, x->client_nonce, DEX_AUTH_BYTES);
	exchange_mac(key, x, "dex client", proof + DEX_AUTH_BYTES);
	return NULL;
}

bool dex_auth_check_answer(const struct dex_auth_key *key, const struct dex_auth_exchange *x,
			   const uint8_t answer[DEX_AUTH_BYTES], uint8_t session[DEX_AUTH_BYTES])
{
	uint8_t want[DEX_AUTH_BYTES];
	exchange_mac(key, x, "dex server", want);
	if (!memeql_sec(want, answer, DEX_AUTH_BYTES))
		return false;
	exchange_mac(key, x, "dex session", session);
	return true;
}

enum read_result { READ_OK, READ_TIMEOUT, READ_CLOSED };

static enum read_result read_timed(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;
	while (len) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int ready = poll(&pfd, 1, timeout_ms);
		if (ready < 0 && errno == EINTR)
			continue;
		if (ready == 0)
			return READ_TIMEOUT;
		ssize_t n = ready < 0 ? -1 : recv(fd, p, len, 0);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return READ_CLOSED;
		p += n;
		len -= (size_t)n;
	}
	return READ_OK;
}

static int write_all(int fd, const void *buf, size_t len)
{
	return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

const char *dex_auth_serve(int fd, const struct dex_auth_key *key, uint8_t session[DEX_AUTH_BYTES])
{
	struct dex_auth_exchange x;
	uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES], proof[DEX_AUTH_PROOF_BYTES], answer[DEX_AUTH_BYTES];
	if (dex_auth_challenge(&x, challenge) != 0)
		return "no random numbers from the kernel";
	if (write_all(fd, challenge, sizeof(challenge)) != 0)
		return "connection closed before authenticating";
	enum read_result got = read_timed(fd, proof, sizeof(proof), DEX_AUTH_TIMEOUT_MS);
	if (got != READ_OK)
		return got == READ_TIMEOUT ? "no authentication within 5 s" : "connection closed before authenticating";
	if (!dex_auth_check_proof(key, &x, proof, answer, session))
		return "wrong secret (authentication failed)";
	if (write_all(fd, answer, sizeof(answer)) != 0)
		return "connection closed while authenticating";
	return NULL;
}

const char *dex_auth_join(int fd, const struct dex_auth_key *key, int wait_ms, uint8_t session[DEX_AUTH_BYTES])
{
	struct dex_auth_exchange x;
	uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES], proof[DEX_AUTH_PROOF_BYTES], answer[DEX_AUTH_BYTES];
	const char *why;
	if (read_timed(fd, challenge, sizeof(challenge), wait_ms) != READ_OK)
		return "no DEX challenge (not a DEX peer, or too busy)";
	if ((why = dex_auth_prove(key, &x, challenge, proof)) != NULL)
		return why;
	if (write_all(fd, proof, sizeof(proof)) != 0)
		return "connection closed while authenticating";
	if (read_timed(fd, answer, sizeof(answer), DEX_AUTH_TIMEOUT_MS) != READ_OK)
		return "refused: wrong secret, or not this run";
	if (!dex_auth_check_answer(key, &x, answer, session))
		return "the other side does not know the secret (impostor)";
	return NULL;
}

uint64_t dex_auth_tag(const uint8_t session[DEX_AUTH_BYTES], unsigned sender)
{
	uint8_t out[DEX_AUTH_BYTES], who = (uint8_t)sender;
	uint64_t value;
	mac(session, "dex ucx tag", &who, 1, "", 0, out);
	memcpy(&value, out, sizeof(value));
	return (value & ((UINT64_C(1) << 55) - 1)) << 8 | who;
}
