/* libFuzzer target: DEX's wire decoder as the runtime uses it on bytes
 * from a peer. The header is checked before the payload is read; the
 * payload the runtime then reads is exactly header.length bytes (a buffer
 * of that size here, so ASan sees any read past it), checked against a run
 * of 4 nodes with two shared regions. The same input also goes through the
 * authentication's decoders (auth.h), which see a stranger's first bytes. */
#include <stdlib.h>
#include <string.h>

#include "../src/auth.h"
#include "../src/protocol.h"

static const struct dex_region_bounds regions[] = {
	{ 0x10000000, 0x10100000 },
	{ 0x7f0000000000, 0x7f0000010000 },
};

static void authentication(const uint8_t *data, size_t size)
{
	static const struct dex_auth_key key = { { 1, 2, 3 } };
	struct dex_auth_exchange x;
	uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES], proof[DEX_AUTH_PROOF_BYTES], answer[DEX_AUTH_BYTES],
		session[DEX_AUTH_BYTES];
	/* as a client: the input is the challenge, then the answer */
	if (size >= DEX_AUTH_CHALLENGE_BYTES + DEX_AUTH_BYTES && !dex_auth_prove(&key, &x, data, proof))
		(void)dex_auth_check_answer(&key, &x, data + DEX_AUTH_CHALLENGE_BYTES, session);
	/* as a server: the input is the proof */
	if (size >= DEX_AUTH_PROOF_BYTES && dex_auth_challenge(&x, challenge) == 0)
		(void)dex_auth_check_proof(&key, &x, data, answer, session);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct dex_validation_limits lim = {
		.nodes = 4, .max_threads = 1024, .max_workers = 256, .regions = regions, .nregions = 2,
	};
	authentication(data, size);
	struct dex_msg_header h;
	if (size < sizeof(h))
		return 0;
	memcpy(&h, data, sizeof(h));
	(void)dex_msg_type_name(h.type);
	if (dex_msg_check_header(&h, &lim) || size - sizeof(h) < h.length)
		return 0;
	uint8_t *payload = malloc(h.length ? h.length : 1);
	if (!payload)
		return 0;
	memcpy(payload, data + sizeof(h), h.length);
	(void)dex_msg_check(&h, payload, &lim);
	free(payload);
	return 0;
}
