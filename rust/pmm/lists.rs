//! The intrusive lists: free lists by [type][size][is_zero] through node slots, and the
//! root LRU lists through `roots`.

use super::*;

#[derive(Copy, Clone, Debug)]
pub(super) struct ListHead {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) len: u64,
}

impl ListHead {
    pub(super) const EMPTY: ListHead = ListHead {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

impl Pmm {
    // ----------------------------------------------------------------------------------
    // Free lists (intrusive, doubly linked through node slots)

    pub(super) fn list_key(&self, i: u32) -> (usize, usize, usize) {
        let n = &self.nodes[i as usize];
        (
            n.ctype as usize,
            order_of(n.shift as u32),
            n.is_zero as usize,
        )
    }

    pub(super) fn link(&mut self, i: u32) {
        debug_assert!(!self.nodes[i as usize].linked);
        let (t, o, z) = self.list_key(i);
        let head = self.free_lists[t][o][z].head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = head;
            n.linked = true;
        }
        if head != NIL {
            self.nodes[head as usize].prev = i;
        } else {
            self.free_lists[t][o][z].tail = i;
        }
        let l = &mut self.free_lists[t][o][z];
        l.head = i;
        l.len += 1;
    }

    pub(super) fn unlink(&mut self, i: u32) {
        if !self.nodes[i as usize].linked {
            return;
        }
        let (t, o, z) = self.list_key(i);
        let (prev, next) = {
            let n = &mut self.nodes[i as usize];
            n.linked = false;
            (
                std::mem::replace(&mut n.prev, NIL),
                std::mem::replace(&mut n.next, NIL),
            )
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.free_lists[t][o][z].head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.free_lists[t][o][z].tail = prev;
        }
        self.free_lists[t][o][z].len -= 1;
    }

    /// Puts a free chunk on its list, unless its root is being evicted (then the eviction
    /// holds it until it ends).
    pub(super) fn link_if_allowed(&mut self, i: u32) {
        let r = self.root_of(i);
        if !self.roots[r as usize].in_eviction {
            self.link(i);
        }
    }

    /// Takes a free chunk of exactly this type and size off its list, zeroed first.
    pub(super) fn pop_free(
        &mut self,
        ctype: ChunkType,
        shift: u32,
        prefer_zero: bool,
    ) -> Option<u32> {
        let (t, o) = (ctype as usize, order_of(shift));
        let order = if prefer_zero { [1, 0] } else { [0, 1] };
        for z in order {
            let head = self.free_lists[t][o][z].head;
            if head != NIL {
                self.unlink(head);
                return Some(head);
            }
        }
        None
    }

    // ----------------------------------------------------------------------------------
    // Root LRU lists (intrusive, doubly linked through `roots`)

    pub(super) fn root_list_remove(&mut self, r: u32) {
        let Some(list) = self.roots[r as usize].list.take() else {
            return;
        };
        let (prev, next) = {
            let root = &mut self.roots[r as usize];
            (
                std::mem::replace(&mut root.prev, NIL),
                std::mem::replace(&mut root.next, NIL),
            )
        };
        let l = list as usize;
        if prev != NIL {
            self.roots[prev as usize].next = next;
        } else {
            self.root_lists[l].head = next;
        }
        if next != NIL {
            self.roots[next as usize].prev = prev;
        } else {
            self.root_lists[l].tail = prev;
        }
        self.root_lists[l].len -= 1;
    }

    pub(super) fn root_list_push_tail(&mut self, r: u32, list: RootList) {
        debug_assert!(self.roots[r as usize].list.is_none());
        let l = list as usize;
        let tail = self.root_lists[l].tail;
        {
            let root = &mut self.roots[r as usize];
            root.list = Some(list);
            root.prev = tail;
            root.next = NIL;
        }
        if tail != NIL {
            self.roots[tail as usize].next = r;
        } else {
            self.root_lists[l].head = r;
        }
        self.root_lists[l].tail = r;
        self.root_lists[l].len += 1;
    }

    /// Whether a root may sit on an LRU list (and so be chosen for eviction).
    pub(super) fn root_evictable(&self, r: u32) -> bool {
        let node = &self.nodes[r as usize];
        let root = &self.roots[r as usize];
        node.ctype == ChunkType::User
            && matches!(node.state, ChunkState::IsSplit | ChunkState::Allocated)
            && root.pinned == 0
            && !root.in_eviction
    }

    /// Restores the LRU invariant for one root after its tree changed: an evictable root not
    /// on a list goes to the tail of USED (as the driver does on unpin); one that is no longer
    /// evictable leaves its list.
    pub(super) fn update_root_lists(&mut self, r: u32) {
        let evictable = self.root_evictable(r);
        match (evictable, self.roots[r as usize].list.is_some()) {
            (true, false) => self.root_list_push_tail(r, RootList::Used),
            (false, true) => self.root_list_remove(r),
            _ => {}
        }
    }
}
