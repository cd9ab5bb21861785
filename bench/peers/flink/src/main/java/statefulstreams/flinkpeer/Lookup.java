package statefulstreams.flinkpeer;

import org.apache.flink.api.common.typeinfo.TypeInformation;

/**
 * The two lookups of the job, each declared once: the state it keeps (the latest record per
 * id), which id of an order it looks up, and where in the order what it found goes.
 */
public enum Lookup {
    USER(User.class, "user") {
        @Override
        long keyOf(PendingOrder pending) {
            return pending.order.userId;
        }

        @Override
        void attach(PendingOrder pending, Object value) {
            pending.user = (User) value;
        }
    },
    ITEM(Item.class, "item") {
        @Override
        long keyOf(PendingOrder pending) {
            return pending.order.itemId;
        }

        @Override
        void attach(PendingOrder pending, Object value) {
            pending.item = (Item) value;
        }
    };

    final Class<?> recordClass;
    /** The word a missing-state reason uses for this lookup. */
    final String reason;

    Lookup(Class<?> recordClass, String reason) {
        this.recordClass = recordClass;
        this.reason = reason;
    }

    abstract long keyOf(PendingOrder pending);

    abstract void attach(PendingOrder pending, Object value);

    @SuppressWarnings("unchecked")
    <V> TypeInformation<V> stateType() {
        return (TypeInformation<V>) TypeInformation.of(recordClass);
    }
}
