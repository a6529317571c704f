/* list.h -- the one intrusive doubly-linked list of kvrouter (libuv's queue.h idea, typed).
 *
 * A kvr_list_t is embedded in the element (the node) and in the owner (the head). The head is a
 * sentinel: an empty list is a head whose prev and next point at itself, so insertion and removal
 * never test for NULL and an element can remove itself knowing nothing of its owner. The element
 * is reached from its node with KVR_CONTAINER_OF (kvr.h).
 *
 * Invariants: a node is in at most one list; kvr_list_remove() leaves the node self-linked, so
 * removing twice is harmless and kvr_list_linked() tells whether it is still in a list. The list
 * owns nothing: freeing the elements is the owner's job, and KVR_LIST_FOREACH_SAFE lets the loop
 * body remove (and free) the current element.
 */
#ifndef KVR_LIST_H
#define KVR_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvr_list_s {
  struct kvr_list_s *prev, *next;
} kvr_list_t;

/* Makes l an empty head, or an unlinked node. */
static inline void kvr_list_init(kvr_list_t *l) {
  l->prev = l->next = l;
}

static inline bool kvr_list_empty(const kvr_list_t *head) {
  return head->next == head;
}

/* True while node is in a list (it was inserted and not removed since). */
static inline bool kvr_list_linked(const kvr_list_t *node) {
  return node->next != node;
}

/* Inserts node first (insert_head) or last (insert_tail) in head's list. */
static inline void kvr_list_insert_head(kvr_list_t *head, kvr_list_t *node) {
  node->next = head->next;
  node->prev = head;
  head->next->prev = node;
  head->next = node;
}

static inline void kvr_list_insert_tail(kvr_list_t *head, kvr_list_t *node) {
  node->prev = head->prev;
  node->next = head;
  head->prev->next = node;
  head->prev = node;
}

/* Unlinks node from its list and leaves it self-linked. */
static inline void kvr_list_remove(kvr_list_t *node) {
  node->prev->next = node->next;
  node->next->prev = node->prev;
  kvr_list_init(node);
}

/* Number of nodes in head's list (walks it). */
static inline size_t kvr_list_count(const kvr_list_t *head) {
  size_t n = 0;
  for (const kvr_list_t *q = head->next; q != head; q = q->next)
    n++;
  return n;
}

/* for (each node q of head's list, first to last); the body may remove and free q's element. */
#define KVR_LIST_FOREACH_SAFE(q, tmp, head)                                                        \
  for ((q) = (head)->next, (tmp) = (q)->next; (q) != (head); (q) = (tmp), (tmp) = (q)->next)

#endif
