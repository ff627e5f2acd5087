/*
 * Prints libxpmem's C view of the broker protocol (src/xpmem_internal.h) for
 * xemem/broker/tests/c_layout.rs, which checks it against the Rust definitions:
 *  - "NAME VALUE" lines: every constant, struct size and field offset;
 *  - "answer HEX" / "request HEX": packets the C structs make, with distinct field values, for
 *    the Rust decoder (and, for the request, the Rust encoder) to be compared against.
 */
#include <stdio.h>

#include "xpmem_internal.h"

#define SHOW(expr) printf("%s %llu\n", #expr, (unsigned long long)(expr))

static void show_bytes(const char *label, const void *bytes, size_t len)
{
	printf("%s ", label);
	for (size_t i = 0; i < len; i++)
		printf("%02x", ((const unsigned char *)bytes)[i]);
	printf("\n");
}

int main(void)
{
	SHOW(WIRE_MAGIC);
	SHOW(WIRE_VERSION);
	SHOW(WIRE_HOLE);
	SHOW(WIRE_REVOCABLE);
	SHOW(WIRE_MAX_RUNS);
	SHOW(WIRE_MAX_FDS);
	SHOW(WIRE_GET_REVOKED_BY_MESSAGE);
	SHOW(WIRE_REASON_WHOLE_PAGES_ONLY);
	SHOW(XEMEM_NAME_MAX);
	SHOW(OP_HELLO);
	SHOW(OP_SERVE);
	SHOW(OP_MAKE);
	SHOW(OP_REMOVE);
	SHOW(OP_GET);
	SHOW(OP_RELEASE);
	SHOW(OP_ATTACH);
	SHOW(OP_DETACH);
	SHOW(OP_LOOKUP);
	SHOW(OP_SIGNAL);
	SHOW(OP_FETCH);
	SHOW(OP_NOTIFY);
	SHOW(OP_REVOKE);
	SHOW(offsetof(struct wire_request, name));
	SHOW(sizeof(struct wire_answer));
	SHOW(sizeof(struct wire_run));

	struct wire_request request = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = OP_ATTACH };
	for (int i = 0; i < 7; i++)
		request.args[i] = 0x1111111111111111ULL * (i + 1);
	show_bytes("request", &request, offsetof(struct wire_request, name));

	struct {
		struct wire_answer header;
		struct wire_run runs[2];
	} answer = {
		.header = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = OP_FETCH, .error = 0, .runs = 2,
			    .results = { 11, 12, 13, 14, 15, 16 } },
		.runs = { { .fd_index = 0, .flags = WIRE_REVOCABLE, .offset = 0x3000, .length = 0x2000 },
			  { .fd_index = WIRE_HOLE, .flags = 0, .offset = 0, .length = 0x1000 } },
	};
	show_bytes("answer", &answer, sizeof answer);
	return 0;
}
