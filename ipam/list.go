package ipam

// list is an intrusive doubly linked list of entries: an entry is in at most
// one list (free, pending or cooldown) at a time, so moving an address
// between states, or taking a specific one out, costs no allocation.
type list struct {
	head, tail *entry
	n          int
}

func (l *list) pushBack(e *entry) {
	e.prev, e.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

// insertByAt inserts e keeping the list sorted by at. Deadlines almost
// always arrive in order, so the walk from the tail stops at once.
func (l *list) insertByAt(e *entry) {
	p := l.tail
	for p != nil && p.at.After(e.at) {
		p = p.prev
	}
	if p == nil {
		e.prev, e.next = nil, l.head
		if l.head != nil {
			l.head.prev = e
		} else {
			l.tail = e
		}
		l.head = e
		l.n++
		return
	}
	e.prev, e.next = p, p.next
	if p.next != nil {
		p.next.prev = e
	} else {
		l.tail = e
	}
	p.next = e
	l.n++
}

func (l *list) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}
