/* A stranger on the UCX fabric: knows a DEX process's worker address (as
 * someone who found it would) but not the run's secret, and sends it one
 * tagged message, as node 1 of the run would have before its tags carried
 * the session's value.
 *   ucx_stranger ADDRESS_FILE MESSAGE_FILE TAG
 * Exit 0 once UCX reports the message sent. (tests/ucx_stranger.py) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

static void *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	static char buf[1 << 16];
	if (!f || (*len = fread(buf, 1, sizeof(buf), f)) == 0) {
		fprintf(stderr, "ucx_stranger: cannot read %s\n", path);
		exit(2);
	}
	fclose(f);
	void *copy = malloc(*len);
	memcpy(copy, buf, *len);
	return copy;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: ucx_stranger ADDRESS_FILE MESSAGE_FILE TAG\n");
		return 2;
	}
	size_t address_len, message_len;
	void *address = slurp(argv[1], &address_len), *message = slurp(argv[2], &message_len);
	uint64_t tag = strtoull(argv[3], NULL, 0);
	ucp_config_t *config;
	ucp_context_h context;
	ucp_worker_h worker;
	ucp_ep_h ep;
	ucp_params_t params = { .field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG };
	ucp_worker_params_t wparams = { .field_mask = 0 };
	if (ucp_config_read(NULL, NULL, &config) != UCS_OK || ucp_init(&params, config, &context) != UCS_OK ||
	    ucp_worker_create(context, &wparams, &worker) != UCS_OK) {
		fprintf(stderr, "ucx_stranger: UCX did not start\n");
		return 1;
	}
	ucp_ep_params_t ep_params = { .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = address };
	if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) {
		fprintf(stderr, "ucx_stranger: no endpoint to that address\n");
		return 1;
	}
	ucp_request_param_t send_params = { .op_attr_mask = 0 };
	ucs_status_ptr_t req = ucp_tag_send_nbx(ep, message, message_len, tag, &send_params);
	if (UCS_PTR_IS_ERR(req)) {
		fprintf(stderr, "ucx_stranger: send failed\n");
		return 1;
	}
	if (req) {
		while (ucp_request_check_status(req) == UCS_INPROGRESS)
			ucp_worker_progress(worker);
		ucp_request_free(req);
	}
	/* let UCX deliver before the endpoint goes */
	for (int i = 0; i < 100000; i++)
		ucp_worker_progress(worker);
	printf("sent %zu bytes with tag %#llx\n", message_len, (unsigned long long)tag);
	return 0;
}
