/* Lists every UCT component UCX loaded, and for each memory domain the transports it offers
 * ("COMPONENT/MD: TL on DEVICE"): the xpmem module, found in the ucx/ directory beside
 * libucs.so, shows up as component xpmem with transport xpmem when it loads and its
 * libxpmem answers. Exits 1 if UCX fails before listing. */
#include <stdio.h>
#include <uct/api/uct.h>

int main(void)
{
	uct_component_h *components;
	unsigned count;
	if (uct_query_components(&components, &count) != UCS_OK) {
		fprintf(stderr, "uct_query_components failed\n");
		return 1;
	}
	for (unsigned c = 0; c < count; c++) {
		uct_component_attr_t attr = { .field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
							    UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT };
		if (uct_component_query(components[c], &attr) != UCS_OK)
			continue;
		uct_md_resource_desc_t mds[attr.md_resource_count + 1];
		attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
		attr.md_resources = mds;
		if (uct_component_query(components[c], &attr) != UCS_OK)
			continue;
		printf("component %s\n", attr.name);
		for (unsigned m = 0; m < attr.md_resource_count; m++) {
			uct_md_config_t *config;
			uct_md_h md;
			uct_tl_resource_desc_t *tls;
			unsigned tl_count;
			if (uct_md_config_read(components[c], NULL, NULL, &config) != UCS_OK)
				continue;
			ucs_status_t status = uct_md_open(components[c], mds[m].md_name, config, &md);
			uct_config_release(config);
			if (status != UCS_OK) {
				printf("%s/%s: cannot open: %s\n", attr.name, mds[m].md_name, ucs_status_string(status));
				continue;
			}
			if (uct_md_query_tl_resources(md, &tls, &tl_count) == UCS_OK) {
				for (unsigned t = 0; t < tl_count; t++)
					printf("%s/%s: %s on %s\n", attr.name, mds[m].md_name, tls[t].tl_name, tls[t].dev_name);
				uct_release_tl_resource_list(tls);
			}
			uct_md_close(md);
		}
	}
	uct_release_component_list(components);
	return 0;
}
