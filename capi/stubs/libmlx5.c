/*
 * libmlx5.so.1 for rdmatap: Debian's perftest and pyverbs' mlx5 modules
 * link Mellanox's provider library, whose real build needs libibverbs'
 * private provider interface. rdmatap has no mlx5 devices, so every
 * function answers as libmlx5 does for a device that is not its own
 * (mlx5dv(7)): mlx5dv_is_supported says no, constructors return NULL with
 * errno EOPNOTSUPP, the rest return EOPNOTSUPP the way their man pages
 * give errors (the errno value, or -errno where the page says so), and
 * the void destructors do nothing. No mlx5 object (DEVX object, mkey,
 * DEK, steering domain, ...) is ever handed out, so a function given one
 * is given a pointer this library never made; it does not touch it.
 * Programs call these only for ConnectX and BlueField devices (perftest's
 * vendor part IDs, pyverbs' tests after mlx5dv_is_supported).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <infiniband/mlx5dv.h>

/* no_object: a constructor's answer, NULL with errno EOPNOTSUPP. */
static void *no_object(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* no_support: an int verb's answer, the errno value EOPNOTSUPP (errno is
 * set to it as well, for callers that read errno). */
static int no_support(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* ---- the device and its contexts ---- */

bool mlx5dv_is_supported(struct ibv_device *device)
{
	(void)device;
	return false;
}

struct ibv_context *mlx5dv_open_device(struct ibv_device *device, struct mlx5dv_context_attr *attr)
{
	(void)device;
	(void)attr;
	return no_object();
}

int mlx5dv_query_device(struct ibv_context *ctx_in, struct mlx5dv_context *attrs_out)
{
	(void)ctx_in;
	(void)attrs_out;
	return no_support();
}

int _mlx5dv_query_port(struct ibv_context *context, uint32_t port_num, struct mlx5dv_port *info, size_t info_len)
{
	(void)context;
	(void)port_num;
	(void)info;
	(void)info_len;
	return no_support();
}

int mlx5dv_get_clock_info(struct ibv_context *context, struct mlx5dv_clock_info *clock_info)
{
	(void)context;
	(void)clock_info;
	return no_support();
}

/* mlx5dv_init_obj(3) fills mlx5 layouts of verbs objects; ours have none. */
int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	(void)obj;
	(void)obj_type;
	return no_support();
}

/* ---- queues ---- */

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				struct mlx5dv_qp_init_attr *mlx5_qp_attr)
{
	(void)context;
	(void)qp_attr;
	(void)mlx5_qp_attr;
	return no_object();
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	(void)qp;
	return no_object();
}

struct ibv_cq_ex *mlx5dv_create_cq(struct ibv_context *context, struct ibv_cq_init_attr_ex *cq_attr,
				   struct mlx5dv_cq_init_attr *mlx5_cq_attr)
{
	(void)context;
	(void)cq_attr;
	(void)mlx5_cq_attr;
	return no_object();
}

/* mlx5dv_qp_cancel_posted_send_wrs(3): the count canceled, or -errno. */
int mlx5dv_qp_cancel_posted_send_wrs(struct mlx5dv_qp_ex *mqp, uint64_t wr_id)
{
	(void)mqp;
	(void)wr_id;
	errno = EOPNOTSUPP;
	return -EOPNOTSUPP;
}

int mlx5dv_dci_stream_id_reset(struct ibv_qp *qp, uint16_t stream_id)
{
	(void)qp;
	(void)stream_id;
	return no_support();
}

int mlx5dv_modify_qp_lag_port(struct ibv_qp *qp, uint8_t port_num)
{
	(void)qp;
	(void)port_num;
	return no_support();
}

int mlx5dv_query_qp_lag_port(struct ibv_qp *qp, uint8_t *port_num, uint8_t *active_port_num)
{
	(void)qp;
	(void)port_num;
	(void)active_port_num;
	return no_support();
}

int mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t udp_sport)
{
	(void)qp;
	(void)udp_sport;
	return no_support();
}

int mlx5dv_modify_qp_sched_elem(struct ibv_qp *qp, const struct mlx5dv_sched_leaf *requestor,
				const struct mlx5dv_sched_leaf *responder)
{
	(void)qp;
	(void)requestor;
	(void)responder;
	return no_support();
}

int mlx5dv_map_ah_to_qp(struct ibv_ah *ah, uint32_t qp_num)
{
	(void)ah;
	(void)qp_num;
	return no_support();
}

int mlx5dv_reserved_qpn_alloc(struct ibv_context *ctx, uint32_t *qpn)
{
	(void)ctx;
	(void)qpn;
	return no_support();
}

int mlx5dv_reserved_qpn_dealloc(struct ibv_context *ctx, uint32_t qpn)
{
	(void)ctx;
	(void)qpn;
	return no_support();
}

/* ---- memory: mkeys, device memory, VAR and UAR pages, packet pacing ---- */

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *mkey_init_attr)
{
	(void)mkey_init_attr;
	return no_object();
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey)
{
	(void)mkey;
	return no_support();
}

int _mlx5dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info, size_t err_info_size)
{
	(void)mkey;
	(void)err_info;
	(void)err_info_size;
	return no_support();
}

void *mlx5dv_dm_map_op_addr(struct ibv_dm *dm, uint8_t op)
{
	(void)dm;
	(void)op;
	return no_object();
}

struct mlx5dv_var *mlx5dv_alloc_var(struct ibv_context *context, uint32_t flags)
{
	(void)context;
	(void)flags;
	return no_object();
}

void mlx5dv_free_var(struct mlx5dv_var *dv_var) { (void)dv_var; }

struct mlx5dv_pp *mlx5dv_pp_alloc(struct ibv_context *context, size_t pp_context_sz, const void *pp_context, uint32_t flags)
{
	(void)context;
	(void)pp_context_sz;
	(void)pp_context;
	(void)flags;
	return no_object();
}

void mlx5dv_pp_free(struct mlx5dv_pp *pp) { (void)pp; }

/* ---- DEVX: device commands, objects, UARs, user memory, EQs ---- */

int mlx5dv_devx_general_cmd(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen)
{
	(void)context;
	(void)in;
	(void)inlen;
	(void)out;
	(void)outlen;
	return no_support();
}

struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(struct ibv_context *context, const void *in, size_t inlen, void *out,
					       size_t outlen)
{
	(void)context;
	(void)in;
	(void)inlen;
	(void)out;
	(void)outlen;
	return no_object();
}

int mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	(void)obj;
	(void)in;
	(void)inlen;
	(void)out;
	(void)outlen;
	return no_support();
}

int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	(void)obj;
	(void)in;
	(void)inlen;
	(void)out;
	(void)outlen;
	return no_support();
}

int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj)
{
	(void)obj;
	return no_support();
}

struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags)
{
	(void)context;
	(void)flags;
	return no_object();
}

void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *devx_uar) { (void)devx_uar; }

struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr, size_t size, uint32_t access)
{
	(void)ctx;
	(void)addr;
	(void)size;
	(void)access;
	return no_object();
}

struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *umem_in)
{
	(void)ctx;
	(void)umem_in;
	return no_object();
}

int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem)
{
	(void)umem;
	return no_support();
}

int mlx5dv_devx_query_eqn(struct ibv_context *context, uint32_t vector, uint32_t *eqn)
{
	(void)context;
	(void)vector;
	(void)eqn;
	return no_support();
}

struct mlx5dv_devx_msi_vector *mlx5dv_devx_alloc_msi_vector(struct ibv_context *ibctx)
{
	(void)ibctx;
	return no_object();
}

int mlx5dv_devx_free_msi_vector(struct mlx5dv_devx_msi_vector *msi)
{
	(void)msi;
	return no_support();
}

struct mlx5dv_devx_eq *mlx5dv_devx_create_eq(struct ibv_context *ibctx, const void *in, size_t inlen, void *out,
					     size_t outlen)
{
	(void)ibctx;
	(void)in;
	(void)inlen;
	(void)out;
	(void)outlen;
	return no_object();
}

int mlx5dv_devx_destroy_eq(struct mlx5dv_devx_eq *eq)
{
	(void)eq;
	return no_support();
}

/* ---- VFIO: driving a ConnectX PCI function from user space ---- */

/* No PCI function is an rdmatap device. */
struct ibv_device **mlx5dv_get_vfio_device_list(struct mlx5dv_vfio_context_attr *attr)
{
	(void)attr;
	return no_object();
}

/* mlx5dv_vfio_get_events_fd(3) returns a file descriptor; there is none:
 * -1 with errno EOPNOTSUPP. */
int mlx5dv_vfio_get_events_fd(struct ibv_context *ibctx)
{
	(void)ibctx;
	errno = EOPNOTSUPP;
	return -1;
}

int mlx5dv_vfio_process_events(struct ibv_context *context)
{
	(void)context;
	return no_support();
}

/* ---- crypto: login sessions and data encryption keys ---- */

int mlx5dv_crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *login_attr)
{
	(void)context;
	(void)login_attr;
	return no_support();
}

int mlx5dv_crypto_login_query_state(struct ibv_context *context, enum mlx5dv_crypto_login_state *state)
{
	(void)context;
	(void)state;
	return no_support();
}

int mlx5dv_crypto_logout(struct ibv_context *context)
{
	(void)context;
	return no_support();
}

struct mlx5dv_crypto_login_obj *mlx5dv_crypto_login_create(struct ibv_context *context,
							   struct mlx5dv_crypto_login_attr_ex *login_attr)
{
	(void)context;
	(void)login_attr;
	return no_object();
}

int mlx5dv_crypto_login_query(struct mlx5dv_crypto_login_obj *crypto_login, struct mlx5dv_crypto_login_query_attr *query_attr)
{
	(void)crypto_login;
	(void)query_attr;
	return no_support();
}

int mlx5dv_crypto_login_destroy(struct mlx5dv_crypto_login_obj *crypto_login)
{
	(void)crypto_login;
	return no_support();
}

struct mlx5dv_dek *mlx5dv_dek_create(struct ibv_context *context, struct mlx5dv_dek_init_attr *init_attr)
{
	(void)context;
	(void)init_attr;
	return no_object();
}

int mlx5dv_dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr)
{
	(void)dek;
	(void)attr;
	return no_support();
}

int mlx5dv_dek_destroy(struct mlx5dv_dek *dek)
{
	(void)dek;
	return no_support();
}

/* ---- transmit scheduling elements ---- */

struct mlx5dv_sched_node *mlx5dv_sched_node_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr)
{
	(void)context;
	(void)sched_attr;
	return no_object();
}

int mlx5dv_sched_node_modify(struct mlx5dv_sched_node *node, const struct mlx5dv_sched_attr *sched_attr)
{
	(void)node;
	(void)sched_attr;
	return no_support();
}

int mlx5dv_sched_node_destroy(struct mlx5dv_sched_node *node)
{
	(void)node;
	return no_support();
}

struct mlx5dv_sched_leaf *mlx5dv_sched_leaf_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr)
{
	(void)context;
	(void)sched_attr;
	return no_object();
}

int mlx5dv_sched_leaf_modify(struct mlx5dv_sched_leaf *leaf, const struct mlx5dv_sched_attr *sched_attr)
{
	(void)leaf;
	(void)sched_attr;
	return no_support();
}

int mlx5dv_sched_leaf_destroy(struct mlx5dv_sched_leaf *leaf)
{
	(void)leaf;
	return no_support();
}

/* ---- flow steering through the kernel (mlx5dv_create_flow(3)) ---- */

struct mlx5dv_flow_matcher *mlx5dv_create_flow_matcher(struct ibv_context *context, struct mlx5dv_flow_matcher_attr *matcher_attr)
{
	(void)context;
	(void)matcher_attr;
	return no_object();
}

int mlx5dv_destroy_flow_matcher(struct mlx5dv_flow_matcher *matcher)
{
	(void)matcher;
	return no_support();
}

struct ibv_flow *mlx5dv_create_flow(struct mlx5dv_flow_matcher *matcher, struct mlx5dv_flow_match_parameters *match_value,
				    size_t num_actions, struct mlx5dv_flow_action_attr actions_attr[])
{
	(void)matcher;
	(void)match_value;
	(void)num_actions;
	(void)actions_attr;
	return no_object();
}

struct ibv_flow_action *mlx5dv_create_flow_action_packet_reformat(struct ibv_context *ctx, size_t data_sz, void *data,
								  enum mlx5dv_flow_action_packet_reformat_type reformat_type,
								  enum mlx5dv_flow_table_type ft_type)
{
	(void)ctx;
	(void)data_sz;
	(void)data;
	(void)reformat_type;
	(void)ft_type;
	return no_object();
}

/*
 * ---- direct rule steering (mlx5dv_dr_flow(3)) ----
 *
 * There is no domain without an mlx5 device. The real library makes a
 * few actions that name no domain (drop, tag, pop VLAN, default miss)
 * from memory alone, but they serve only rules of a domain; these make
 * none either.
 */

struct mlx5dv_dr_domain *mlx5dv_dr_domain_create(struct ibv_context *ctx, enum mlx5dv_dr_domain_type type)
{
	(void)ctx;
	(void)type;
	return no_object();
}

int mlx5dv_dr_domain_sync(struct mlx5dv_dr_domain *domain, uint32_t flags)
{
	(void)domain;
	(void)flags;
	return no_support();
}

void mlx5dv_dr_domain_allow_duplicate_rules(struct mlx5dv_dr_domain *domain, bool allow)
{
	(void)domain;
	(void)allow;
}

int mlx5dv_dr_domain_destroy(struct mlx5dv_dr_domain *domain)
{
	(void)domain;
	return no_support();
}

/* mlx5dv_dump(3): 0, or the errno value. */
int mlx5dv_dump_dr_domain(FILE *fout, struct mlx5dv_dr_domain *domain)
{
	(void)fout;
	(void)domain;
	return no_support();
}

struct mlx5dv_dr_table *mlx5dv_dr_table_create(struct mlx5dv_dr_domain *domain, uint32_t level)
{
	(void)domain;
	(void)level;
	return no_object();
}

int mlx5dv_dr_table_destroy(struct mlx5dv_dr_table *table)
{
	(void)table;
	return no_support();
}

struct mlx5dv_dr_matcher *mlx5dv_dr_matcher_create(struct mlx5dv_dr_table *table, uint16_t priority,
						   uint8_t match_criteria_enable, struct mlx5dv_flow_match_parameters *mask)
{
	(void)table;
	(void)priority;
	(void)match_criteria_enable;
	(void)mask;
	return no_object();
}

int mlx5dv_dr_matcher_set_layout(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_dr_matcher_layout *layout)
{
	(void)matcher;
	(void)layout;
	return no_support();
}

int mlx5dv_dr_matcher_destroy(struct mlx5dv_dr_matcher *matcher)
{
	(void)matcher;
	return no_support();
}

struct mlx5dv_dr_rule *mlx5dv_dr_rule_create(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_flow_match_parameters *value,
					     size_t num_actions, struct mlx5dv_dr_action *actions[])
{
	(void)matcher;
	(void)value;
	(void)num_actions;
	(void)actions;
	return no_object();
}

int mlx5dv_dr_rule_destroy(struct mlx5dv_dr_rule *rule)
{
	(void)rule;
	return no_support();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_table(struct mlx5dv_dr_table *table)
{
	(void)table;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_ibv_qp(struct ibv_qp *ibqp)
{
	(void)ibqp;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_devx_tir(struct mlx5dv_devx_obj *devx_obj)
{
	(void)devx_obj;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_vport(struct mlx5dv_dr_domain *domain, uint32_t vport)
{
	(void)domain;
	(void)vport;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_ib_port(struct mlx5dv_dr_domain *domain, uint32_t ib_port)
{
	(void)domain;
	(void)ib_port;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_array(struct mlx5dv_dr_domain *domain, size_t num_dest,
							    struct mlx5dv_dr_action_dest_attr *dests[])
{
	(void)domain;
	(void)num_dest;
	(void)dests;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_drop(void) { return no_object(); }

struct mlx5dv_dr_action *mlx5dv_dr_action_create_default_miss(void) { return no_object(); }

struct mlx5dv_dr_action *mlx5dv_dr_action_create_tag(uint32_t tag_value)
{
	(void)tag_value;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_flow_counter(struct mlx5dv_devx_obj *devx_obj, uint32_t offset)
{
	(void)devx_obj;
	(void)offset;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_flow_sampler(struct mlx5dv_dr_flow_sampler_attr *attr)
{
	(void)attr;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_packet_reformat(struct mlx5dv_dr_domain *domain, uint32_t flags,
								 enum mlx5dv_flow_action_packet_reformat_type reformat_type,
								 size_t data_sz, void *data)
{
	(void)domain;
	(void)flags;
	(void)reformat_type;
	(void)data_sz;
	(void)data;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_modify_header(struct mlx5dv_dr_domain *domain, uint32_t flags,
							       size_t actions_sz, __be64 actions[])
{
	(void)domain;
	(void)flags;
	(void)actions_sz;
	(void)actions;
	return no_object();
}

struct mlx5dv_dr_action *mlx5dv_dr_action_create_pop_vlan(void) { return no_object(); }

struct mlx5dv_dr_action *mlx5dv_dr_action_create_push_vlan(struct mlx5dv_dr_domain *domain, __be32 vlan_hdr)
{
	(void)domain;
	(void)vlan_hdr;
	return no_object();
}

int mlx5dv_dr_action_destroy(struct mlx5dv_dr_action *action)
{
	(void)action;
	return no_support();
}
