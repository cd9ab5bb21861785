package statefulstreams.flinkpeer;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;

/**
 * The three topics' JSON payloads (DESIGN.md §3, pipeline/wire.py): required and optional
 * fields, their types, and the checks that make a message a dead letter. Extra fields are
 * ignored; an empty payload on a changelog is a tombstone of the key. The checks follow
 * wire.py's (required, null, type, 64-bit range, finite numbers, times in years 1 to 9999);
 * the error texts are this class's own.
 */
public final class WireFormat {
    static final int MAX_PAYLOAD_BYTES = 1 << 20;
    static final long MIN_TIME_MS = -62_135_596_800_000L;
    static final long MAX_TIME_MS = 253_402_300_799_999L;
    static final long NONE = -1;

    private final ObjectMapper mapper = new ObjectMapper();

    /** A message that cannot be used; the message is its dead letter's one-line error. */
    public static final class BadMessage extends Exception {
        private static final long serialVersionUID = 1L;

        BadMessage(String message) {
            super(message);
        }
    }

    public User parseUser(byte[] payload) throws BadMessage {
        JsonNode node = object(payload);
        User user = new User();
        user.id = requiredLong(node, "id", false);
        user.firstName = optionalText(node, "firstName");
        user.lastName = optionalText(node, "lastName");
        user.emailAddress = optionalText(node, "emailAddress");
        user.createdAt = optionalLong(node, "createdAt", true);
        user.deletedAt = optionalLong(node, "deletedAt", true);
        user.mergedAt = optionalLong(node, "mergedAt", true);
        user.parentUserId = optionalLong(node, "parentUserId", false);
        return user;
    }

    public Item parseItem(byte[] payload) throws BadMessage {
        JsonNode node = object(payload);
        Item item = new Item();
        item.id = requiredLong(node, "id", false);
        item.createdAt = optionalLong(node, "createdAt", true);
        item.adjective = optionalText(node, "adjective");
        item.category = optionalText(node, "category");
        item.modifier = optionalText(node, "modifier");
        item.name = optionalText(node, "name");
        item.price = requiredDouble(node, "price");
        return item;
    }

    public Order parseOrder(byte[] payload) throws BadMessage {
        if (payload == null || payload.length == 0) {
            throw new BadMessage("empty payload; only changelog topics take tombstones");
        }
        JsonNode node = object(payload);
        Order order = new Order();
        order.invoiceId = requiredLong(node, "invoiceId", false);
        order.lineItemId = requiredLong(node, "lineItemId", false);
        order.userId = requiredLong(node, "userId", false);
        order.itemId = requiredLong(node, "itemId", false);
        order.itemName = optionalText(node, "itemName");
        order.itemCategory = optionalText(node, "itemCategory");
        order.price = requiredDouble(node, "price");
        order.createdAt = requiredLong(node, "createdAt", true);
        order.paidAt = optionalLong(node, "paidAt", true);
        return order;
    }

    /** The id a tombstone deletes: its message key, a 64-bit integer in ASCII digits. */
    public static long tombstoneKey(String key) throws BadMessage {
        if (key == null) {
            throw new BadMessage("tombstone key is missing; it must be the 64-bit integer id to delete");
        }
        String text = key.strip();
        if (text.matches("[+-]?[0-9]{1,19}")) {
            try {
                return Long.parseLong(text.startsWith("+") ? text.substring(1) : text);
            } catch (NumberFormatException outOfRange) {
                // reported below
            }
        }
        throw new BadMessage("tombstone key '" + shorten(key) + "' is not a 64-bit integer id");
    }

    private JsonNode object(byte[] payload) throws BadMessage {
        if (payload.length > MAX_PAYLOAD_BYTES) {
            throw new BadMessage("payload is " + payload.length + " bytes, over the " + MAX_PAYLOAD_BYTES + "-byte limit");
        }
        JsonNode node;
        try {
            node = mapper.readTree(payload);
        } catch (JsonProcessingException exc) {
            throw new BadMessage("payload is not valid JSON: " + exc.getOriginalMessage());
        } catch (IOException exc) {
            throw new BadMessage("cannot read the payload: " + exc.getMessage());
        }
        if (node == null || !node.isObject()) {
            throw new BadMessage("payload must be a JSON object, got " + (node == null ? "nothing" : node.getNodeType()));
        }
        return node;
    }

    private static JsonNode present(JsonNode node, String name) throws BadMessage {
        JsonNode value = node.get(name);
        if (value == null) {
            throw new BadMessage("required field '" + name + "' is missing");
        }
        if (value.isNull()) {
            throw new BadMessage("field '" + name + "' is null; it is required");
        }
        return value;
    }

    private static long requiredLong(JsonNode node, String name, boolean time) throws BadMessage {
        return asLong(present(node, name), name, time);
    }

    private static long optionalLong(JsonNode node, String name, boolean time) throws BadMessage {
        JsonNode value = node.get(name);
        return value == null || value.isNull() ? NONE : asLong(value, name, time);
    }

    private static long asLong(JsonNode value, String name, boolean time) throws BadMessage {
        if (!value.isNumber()) {
            throw new BadMessage("field '" + name + "' must be an integer, got " + value.getNodeType());
        }
        if (!value.canConvertToExactIntegral() || !value.canConvertToLong()) {
            throw new BadMessage("field '" + name + "' must be a 64-bit integer, got " + shorten(value.toString()));
        }
        long result = value.asLong();
        if (time && (result < MIN_TIME_MS || result > MAX_TIME_MS)) {
            throw new BadMessage("field '" + name + "' = " + result + " is not a time in years 1 to 9999");
        }
        return result;
    }

    private static double requiredDouble(JsonNode node, String name) throws BadMessage {
        JsonNode value = present(node, name);
        if (!value.isNumber()) {
            throw new BadMessage("field '" + name + "' must be a number, got " + value.getNodeType());
        }
        double result = value.asDouble();
        if (!Double.isFinite(result)) {
            throw new BadMessage("field '" + name + "' must be a finite number");
        }
        return result;
    }

    private static String optionalText(JsonNode node, String name) throws BadMessage {
        JsonNode value = node.get(name);
        if (value == null || value.isNull()) {
            return null;
        }
        if (!value.isTextual()) {
            throw new BadMessage("field '" + name + "' must be a string, got " + value.getNodeType());
        }
        return value.textValue();
    }

    static String shorten(String text) {
        return text.length() <= 40 ? text : text.substring(0, 39) + "…";
    }
}
